"""The program the code reward runs in the sandbox for a row's assert-style and call tests.

It is shipped into the sandbox as ``harness.py`` and run by the sandbox's interpreter (standard
library only: it imports nothing of rlvr). It reads a one-time marker from the first line of
stdin, then the model's program (``solution.py``) and the tests (``tests.json``: a list of
``{"assert": code}`` or ``{"call": expression}``), runs the program once and every test after
it in the program's namespace, and writes one line per test to stdout:

    <marker> [index, ok, detail]

``detail`` is the exception's type name for a failed test, and for a call test the JSON text
of the value it returned (the reward compares it with the expected value outside the sandbox,
so expected values never enter it). Index -1 reports a program that failed to load.

The marker is why the model's own output cannot pass for a report: the program never sees it
in its files or its stdin (stdin is closed before the program runs). A program that exits
early (``exit(0)``, ``os._exit``) leaves its tests unreported, which counts as failed. What the
marker does not stop: a program that walks the interpreter's frames or objects to find it
(assert-style tests run in the program's own interpreter; docs/data.md says so).
"""

import json
import os
import sys


def main() -> None:
    marker = sys.stdin.readline().strip()
    sys.stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the program reads an empty stdin
    write, dumps = os.write, json.dumps  # taken before the program can rebind them

    def report(index: int, ok: bool, detail: str = "") -> None:
        # a leading newline: the program's own output may have left a line unfinished
        write(1, ("\n" + marker + " " + dumps([index, ok, detail]) + "\n").encode())

    with open("tests.json") as f:
        tests = json.load(f)
    with open("solution.py") as f:
        source = f.read()
    namespace = {"__name__": "solution", "__file__": "solution.py"}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the program did not load
        report(-1, False, type(exc).__name__)
        return
    for index, test in enumerate(tests):
        try:
            if "call" in test:
                value = eval(compile(test["call"], f"test_{index}", "eval"), namespace)
                report(index, True, dumps(value, sort_keys=True))
            else:
                exec(compile(test["assert"], f"test_{index}", "exec"), namespace)
                report(index, True)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from the program fails its test
            report(index, False, type(exc).__name__)


if __name__ == "__main__":
    main()
