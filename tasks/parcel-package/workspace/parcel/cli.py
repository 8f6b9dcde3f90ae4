"""The parcel command."""

import argparse
import json
from pathlib import Path

from parcel.labels import build_label


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parcel")
    parser.add_argument("orders", type=Path)
    parser.add_argument("--out", type=Path, default=Path("labels"))
    args = parser.parse_args(argv)
    args.out.mkdir(exist_ok=True)
    for order in json.loads(args.orders.read_text()):
        label = build_label(order)
        (args.out / f"{order['id']}.json").write_text(json.dumps(label))
    return 0
