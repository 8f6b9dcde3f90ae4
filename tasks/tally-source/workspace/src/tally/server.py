from tally.store import MemoryStore

DEFAULT_PORT = 7070


def start(port: int = DEFAULT_PORT) -> None:
    store = MemoryStore()
    print(f"tally listening on {port} with {store!r}")
