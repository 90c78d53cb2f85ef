#!/usr/bin/env python3
"""The longest functions of the HTTP clients (issue 40): every function of
clients/node (*.js, node_modules aside) and clients/python (*.py) measured
in lines, from its first line to its last, nested functions counted as part
of their parent (a parent's lines contain them).  Exits 1, naming them,
when one is over the limit (80 lines by default).

    clients/scripts/function_lengths.py [--limit N] [--top N] [--lang js|py] [FILE...]

clients/test.sh runs it first in each unit suite (node_unit: --lang js,
python_unit: --lang py); its last line reads "ok - function lengths: ..."
or "not ok - function lengths: ...".

Python is measured with its own parser (ast); JavaScript with a small
tokenizer (strings, template literals, comments and regular expressions
skipped) that pairs the braces of function bodies: a brace after =>, or
after the parameter list of `function name(...)` or of a method
`name(...)`."""

import argparse
import ast
import os
import sys
from typing import Iterator, List, Optional, Tuple

CLIENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYWORDS = {"if", "for", "while", "switch", "catch", "with", "return", "typeof", "await", "new", "delete",
            "void", "in", "of", "instanceof", "do", "else", "try", "finally", "case", "yield", "throw"}

Function = Tuple[str, int, int, str]  # file, first line, lines, name


def python_functions(path: str) -> Iterator[Function]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = node.end_lineno or node.lineno
            yield path, node.lineno, end - node.lineno + 1, node.name


class _JsScanner:
    """JavaScript's tokens, as far as pairing braces needs: punctuation one
    character at a time, names and numbers whole; strings, template
    literals, regular expressions and comments left out (a template's
    ${...} is tokenized)."""

    def __init__(self, text: str) -> None:
        self.text, self.i, self.line, self.n = text, 0, 1, len(text)
        self.prev = ""  # the previous significant token: tells a regex from a division
        self.templates: List[int] = []  # brace depth at each open ${ of a template literal
        self.depth = 0

    def template(self) -> None:
        """From inside a template literal to its end, or into a ${."""
        text, i = self.text, self.i
        while i < self.n:
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == "\n":
                self.line += 1
            if c == "`":
                break
            if c == "$" and text.startswith("${", i):
                self.templates.append(self.depth)
                self.depth += 1
                break
            i += 1
        self.i = i + (2 if text.startswith("${", i) else 1)
        self.prev = "str"

    def skip(self) -> bool:
        """Skips white space, a comment or a string; False when none is next."""
        text, i, c = self.text, self.i, self.text[self.i]
        if c.isspace():
            self.line += c == "\n"
            self.i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            self.i = self.n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = self.n if end < 0 else end + 2
            self.line += text.count("\n", i, end)
            self.i = end
        elif c in "'\"":
            i += 1
            while i < self.n and text[i] != c:
                i += 2 if text[i] == "\\" else 1
            self.i, self.prev = i + 1, "str"
        elif c == "`":
            self.i += 1
            self.template()
        elif c == "/" and (self.prev in ("",) or self.prev in KEYWORDS or
                           (len(self.prev) == 1 and self.prev in "(,=:[!&|?{};+-*%<>~^")):
            self.regex()
        else:
            return False
        return True

    def regex(self) -> None:
        text, i, in_class = self.text, self.i + 1, False
        while i < self.n and (in_class or text[i] != "/"):
            if text[i] == "\\":
                i += 1
            elif text[i] in "[]":
                in_class = text[i] == "["
            i += 1
        i += 1
        while i < self.n and text[i].isalpha():
            i += 1
        self.i, self.prev = i, "regex"

    def tokens(self) -> Iterator[Tuple[str, int]]:
        text = self.text
        while self.i < self.n:
            if self.skip():
                continue
            i, c = self.i, text[self.i]
            if c.isalnum() or c in "_$":
                j = i
                while j < self.n and (text[j].isalnum() or text[j] in "_$"):
                    j += 1
                tok = text[i:j]
            else:
                tok = "=>" if text.startswith("=>", i) else c
                self.depth += {"{": 1, "}": -1}.get(tok, 0)
                if tok == "}" and self.templates and self.depth == self.templates[-1]:
                    self.templates.pop()
                    self.i += 1
                    self.template()  # the template goes on after its ${...}
                    continue
            self.i, self.prev = i + len(tok), tok
            yield tok, self.line


def js_tokens(text: str) -> Iterator[Tuple[str, int]]:
    return _JsScanner(text).tokens()


def js_functions(path: str) -> Iterator[Function]:
    with open(path, encoding="utf-8") as f:
        tokens = list(js_tokens(f.read()))
    opens: List[Optional[Tuple[int, str]]] = []  # per open brace: (first line, name) of a function body
    parens: List[int] = []  # index of each open (
    closed_paren: Optional[int] = None  # index of the ( matching the ) just before
    for k, (tok, line) in enumerate(tokens):
        if tok == "(":
            parens.append(k)
        elif tok == ")":
            closed_paren = parens.pop() if parens else None
        elif tok == "{":
            prev = tokens[k - 1][0] if k else ""
            start: Optional[Tuple[int, str]] = None
            if prev == "=>":
                start = (line, "=>")
                # the arrow's own first line: its parameter list's
                j = k - 2
                if j >= 0 and tokens[j][0] == ")" and closed_paren is not None and tokens[closed_paren][1] <= line:
                    start = (tokens[closed_paren][1], "=>")
            elif prev == ")" and closed_paren is not None and closed_paren > 0:
                before = tokens[closed_paren - 1][0]
                if before == "function" or (tokens[closed_paren - 2][0] == "function" if closed_paren > 1 else False):
                    start = (tokens[closed_paren - 1][1], before)
                elif (before[:1].isalpha() or before[:1] in "_$") and before not in KEYWORDS:
                    start = (tokens[closed_paren - 1][1], before)
            opens.append(start)
        elif tok == "}":
            start = opens.pop() if opens else None
            if start is not None:
                yield path, start[0], line - start[0] + 1, start[1]


def sources(files: List[str], lang: Optional[str]) -> Iterator[str]:
    if files:
        yield from files
        return
    suffix = (".js", ".py") if lang is None else ("." + lang,)
    for sub in ("node", "python", "scripts"):
        for root, dirs, names in os.walk(os.path.join(CLIENTS, sub)):
            dirs[:] = sorted(d for d in dirs if d not in ("node_modules", "__pycache__", "build", "dist")
                             and not d.endswith(".egg-info"))
            for name in sorted(names):
                if name.endswith(suffix):
                    yield os.path.join(root, name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--top", type=int, default=0, help="also list the N longest functions")
    ap.add_argument("--lang", choices=("js", "py"), help="only this language's files")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    found: List[Function] = []
    for path in sources(args.files, args.lang):
        found.extend(python_functions(path) if path.endswith(".py") else js_functions(path))
    found.sort(key=lambda f: -f[2])
    for f in found[:args.top]:
        print(f"{f[2]:5d} {os.path.relpath(f[0], CLIENTS)}:{f[1]} {f[3]}")
    over = [f for f in found if f[2] > args.limit]
    sys.stdout.flush()
    for f in over:
        print(f"function_lengths: {os.path.relpath(f[0], CLIENTS)}:{f[1]}: {f[3]} is {f[2]} lines, "
              f"over {args.limit}", file=sys.stderr)
    print(f"{'not ok' if over else 'ok'} - function lengths: {len(found)} functions, the longest "
          f"{found[0][2] if found else 0} lines, {len(over)} over {args.limit}", flush=True)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
