"""Record slow tests for the scheduling in `tests/conftest.py`.

    python .ci/durations.py BACKEND REPORT [REPORT ...]

Each REPORT is the output of a pytest run on BACKEND with
`--durations=0` (a CI log cut to that backend's run will do). The setup,
call and teardown times of each test are added; the tests of 5 s or more
replace BACKEND's entry of `tests/durations.json`.
"""

import json
import os
import re
import sys

LINE = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(\S+)")
MIN_SECONDS = 5.0
PATH = os.path.join(os.path.dirname(__file__), "..", "tests", "durations.json")


def parse(lines):
    seconds = {}
    for line in lines:
        match = LINE.match(line)
        if match:
            # `--dist loadgroup` appends "@group" to grouped tests' ids.
            nodeid = re.sub(r"@[^\]@]*$", "", match.group(2))
            seconds[nodeid] = seconds.get(nodeid, 0.0) + float(match.group(1))
    return seconds


def main(backend, reports):
    lines = []
    for report in reports:
        with open(report, errors="replace") as f:
            lines += f.readlines()
    seconds = parse(lines)
    if not seconds:
        sys.exit(f"no `--durations` lines in {reports}")
    try:
        with open(PATH) as f:
            recorded = json.load(f)
    except FileNotFoundError:
        recorded = {}
    recorded[backend] = {
        nodeid: round(value, 1)
        for nodeid, value in seconds.items()
        if value >= MIN_SECONDS
    }
    with open(PATH, "w") as f:
        json.dump(recorded, f, indent=1, sort_keys=True)
        f.write("\n")
    print(
        f"{backend}: {len(recorded[backend])} tests of {MIN_SECONDS} s or more"
    )


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
