#!/usr/bin/env python3
"""The lengths of the C functions of src/, and of its files.

A function is counted from the line naming it (pgindent puts the name at the
start of a line, its type on the line before) to its closing brace, both
included: the body of a function starts with "{" and ends with "}", each
alone at the start of a line.

    function_lengths.py [--limit N] [--file-limit M] [--exempt FILE]... [SRCDIR]
        check: exit 1, naming each function longer than N lines (120) and
        each .c file longer than M lines (1000), longest first; a file
        named with --exempt (number_format.c, the ECMAScript number
        algorithm, by default) is left out of both checks, and a function
        that is a table (TABLE_FUNCTIONS below: IdemGucInit, the settings)
        out of the first
    function_lengths.py --list [--top K] [SRCDIR]
        the K (20) longest functions, longest first, and the longest files

Only the .c files of SRCDIR count.
"""

import os
import re
import sys

FUNCTION_LIMIT = 120
FILE_LIMIT = 1000
# the ECMAScript number algorithm (Ryu-like shortest digits and its tables):
# one algorithm, kept whole
DEFAULT_EXEMPT = ["number_format.c"]
# functions that are tables written as code, left out of the check of
# functions (their files are still checked)
TABLE_FUNCTIONS = {
    "IdemGucInit": "the table of the idempotency.* settings, one Define*Variable call each",
}

NAME = re.compile(r"^([A-Za-z_]\w*)\s*\(")


def functions(path):
    """[(name, first line, last line)] of the functions defined in path."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().split("\n")
    found = []
    i = 0
    while i < len(lines):
        if lines[i].rstrip() != "{":
            i += 1
            continue
        # the declarator: the lines above, back to the one naming the function
        name, start = None, None
        j = i - 1
        while j >= 0 and j >= i - 12:
            text = lines[j]
            if not text.strip() or text.rstrip().endswith((";", "}", "*/")):
                break
            m = NAME.match(text)
            if m:
                name, start = m.group(1), j
                break
            j -= 1
        # the body's end: the first "}" alone at the start of a line
        k = i + 1
        while k < len(lines) and not re.match(r"^\}\s*$", lines[k]):
            k += 1
        if name is not None and name not in ("if", "for", "while", "switch", "return", "sizeof"):
            found.append((name, start + 1, k + 1))
        i = k + 1
    return found


def main(argv):
    limit, file_limit, exempt, listing, top, args = FUNCTION_LIMIT, FILE_LIMIT, [], False, 20, []
    it = iter(argv)
    try:
        for a in it:
            if a == "--limit":
                limit = int(next(it))
            elif a == "--file-limit":
                file_limit = int(next(it))
            elif a == "--exempt":
                exempt.append(next(it))
            elif a == "--list":
                listing = True
            elif a == "--top":
                top = int(next(it))
            elif a.startswith("-") or args:
                raise ValueError(a)
            else:
                args.append(a)
    except (StopIteration, ValueError):
        sys.stderr.write(__doc__)
        return 2
    if not exempt:
        exempt = DEFAULT_EXEMPT
    srcdir = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    srcdir = os.path.normpath(srcdir)

    rows, files = [], []
    for f in sorted(os.listdir(srcdir)):
        if not f.endswith(".c"):
            continue
        path = os.path.join(srcdir, f)
        with open(path, encoding="utf-8", errors="replace") as fh:
            files.append((sum(1 for _ in fh), f))
        for name, first, last in functions(path):
            rows.append((last - first + 1, f, first, name))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    files.sort(key=lambda r: (-r[0], r[1]))

    if listing:
        for n, f, first, name in rows[:top]:
            print(f"{n:5d}  src/{f}:{first}: {name}")
        print()
        for n, f in files[:10]:
            print(f"{n:5d}  src/{f}")
        return 0

    long_fns = [r for r in rows if r[0] > limit and r[1] not in exempt and r[3] not in TABLE_FUNCTIONS]
    long_files = [r for r in files if r[0] > file_limit and r[1] not in exempt]
    longest = next((r for r in rows if r[1] not in exempt and r[3] not in TABLE_FUNCTIONS), None)
    if not long_fns and not long_files:
        what = f"longest {longest[3]} ({longest[0]} lines)" if longest else "no function"
        print(f"function lengths of {srcdir}: {len(rows)} functions in {len(files)} files, "
              f"none over {limit} lines ({what}), no file over {file_limit} lines"
              + f" ({', '.join(exempt + sorted(TABLE_FUNCTIONS))} aside)")
        return 0
    print(f"function lengths of {srcdir}: {len(long_fns)} function(s) over {limit} lines, "
          f"{len(long_files)} file(s) over {file_limit} lines"
          + f" ({', '.join(exempt + sorted(TABLE_FUNCTIONS))} aside):")
    for n, f, first, name in long_fns:
        print(f"  src/{f}:{first}: {name}: {n} lines")
    for n, f in long_files:
        print(f"  src/{f}: {n} lines")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
