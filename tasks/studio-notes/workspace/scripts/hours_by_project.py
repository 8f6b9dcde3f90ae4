"""Print the hours of data/hours.csv added up per project."""

import csv
from collections import defaultdict

totals: dict[str, float] = defaultdict(float)
with open("data/hours.csv", newline="") as f:
    for row in csv.DictReader(f):
        totals[row["project"]] += float(row["hours"])
for project, hours in sorted(totals.items()):
    print(f"{project}: {hours:g} h")
