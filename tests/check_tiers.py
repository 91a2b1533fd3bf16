"""Every CTest test carries exactly one tier label (tests/CMakeLists.txt: unit, process, fault, slow).

Run by CTest as `tiers_check` in the build folder: lists the tests with `ctest --show-only=json-v1` and names
each test whose tier labels are not exactly one, with the labels it has.
"""
import json
import subprocess
import sys

TIERS = {"unit", "process", "fault", "slow"}


def main(ctest: str) -> int:
    listing = json.loads(subprocess.run([ctest, "--show-only=json-v1"], check=True, capture_output=True,
                                        text=True).stdout)
    bad = []
    for test in listing["tests"]:
        labels = []
        for prop in test.get("properties", []):
            if prop["name"] == "LABELS":
                labels = list(prop["value"])
        tiers = [label for label in labels if label in TIERS]
        if len(tiers) != 1:
            bad.append(f"{test['name']}: tier labels {tiers or 'none'} (labels {labels})")
    if bad:
        print(f"{len(bad)} tests do not carry exactly one tier label of {sorted(TIERS)}; give each one in "
              "tests/CMakeLists.txt (dtrain_tier):")
        print("\n".join(bad))
        return 1
    print(f"{len(listing['tests'])} tests, each with exactly one tier label")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
