from tally.store import MemoryStore


def test_add():
    assert MemoryStore().add("a") == 1


def test_add_twice():
    s = MemoryStore()
    s.add("a")
    assert s.add("a") == 2


def test_many_keys():
    s = MemoryStore()
    for i in range(10):
        s.add(str(i))
    assert len(s.counts) == 10
