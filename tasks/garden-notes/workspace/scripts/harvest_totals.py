"""Print the kilos of data/harvest.csv added up per crop."""

import csv
from collections import defaultdict

totals: dict[str, float] = defaultdict(float)
with open("data/harvest.csv", newline="") as f:
    for row in csv.DictReader(f):
        totals[row["crop"]] += float(row["kg"])
for crop, kg in sorted(totals.items()):
    print(f"{crop}: {kg:g} kg")
