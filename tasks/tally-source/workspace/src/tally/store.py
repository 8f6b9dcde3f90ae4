MAX_KEYS = 1000


class MemoryStore:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, key: str) -> int:
        if key not in self.counts and len(self.counts) >= MAX_KEYS:
            raise ValueError("store full")
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key]
