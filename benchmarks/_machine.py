"""Prints the machine and the versions a check runs on (its first lines), and writes them as JSON.

    python benchmarks/_machine.py [--json PATH]
"""

import argparse
import json
import os
import sys

import _results  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--json", default=None)
args = parser.parse_args()
print(json.dumps({"commit": _results.commit(), **_results.machine()}))
_results.record(args.json, {})
