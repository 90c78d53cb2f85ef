#!/usr/bin/python3
"""The client code of the documentation runs as written.

Every ```js, ```ts, ```python block of the Markdown files (the client
READMEs, README.md, CONTRIBUTING.md, doc/*.md, examples/**/*.md) is
extracted and run as a program against a database of its own (one per
file, the extension created), as test/t/080_doc_examples.pl does for the
SQL blocks.  The file's ```sql blocks and its <!-- sql-setup ... -->
comments run first, in that database, in the order they come before each
snippet (080's markers; <!-- norun: reason --> leaves a ```sql block out).

Markers, HTML comments on the line(s) before a block (hidden when the
Markdown is rendered; CONTRIBUTING.md, "Client code in the documentation"):

  <!-- fragment: REASON -->   the next block is not a program (a part of
                              one, an outline): it is not run, and is
                              counted and printed with its reason
  <!-- serves: METHOD PATH JSON -->
                              the next block is a server: it is run with
                              PORT set, asked METHOD PATH with the JSON body
                              and an Idempotency-Key twice (the first answer
                              a 2xx, the second its replay: same status and
                              body, Idempotent-Replayed: true), then stopped
                              (SIGTERM)
  <!-- from: PATH -->         the next block is quoted from PATH (relative to
                              the top of the tree): it must be found there
                              line for line; PATH is tested by its own suite

Any other block runs to its end and must exit 0 (within 60 s); a block
that makes a web application (express(), FastAPI(), Starlette()) without
a serves or fragment marker fails, as an application never asked proves
nothing.  A program
gets DATABASE_URL and PGHOST, PGPORT, PGDATABASE, PGUSER naming the file's
database (a superuser), and PORT; JavaScript finds `@idempotency/express`,
`express` and `pg` (clients/node and its node_modules); TypeScript is
compiled with tsc --strict first; Python finds `idempotency_asgi`
(clients/python).  A failure names the file and the line of the block.

    clients/snippets/run.py node|python [FILE.md...]

The database: IDEM_TEST_PGHOST, IDEM_TEST_PGPORT, IDEM_TEST_PGUSER (a
superuser; clients/test.sh sets them).  Exits 1 when a block failed.
"""

import glob
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LANGS = {"js": "node", "javascript": "node", "ts": "node", "typescript": "node",
         "python": "python", "py": "python"}
PY = "/usr/bin/python3"
# a block that makes a web application must be asked (serves) or be a fragment
APP = re.compile(r"\bexpress\(\)|\b(FastAPI|Starlette)\(")
CREATE_EXTENSION = re.compile(r"CREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?idempotency\b", re.I)


class DocError(Exception):
    pass


def default_files():
    files = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"]
    files += sorted(glob.glob("doc/*.md", root_dir=ROOT))
    files += sorted(glob.glob("clients/*/README.md", root_dir=ROOT))
    files += sorted(f for f in glob.glob("examples/**/*.md", root_dir=ROOT, recursive=True)
                    if "node_modules" not in f)
    return [f for f in files if os.path.isfile(os.path.join(ROOT, f))]


def parse(path):
    """The steps of one Markdown file: dicts with kind 'sql', 'setup',
    'code' (lang, fence), and for code its marker (fragment, serves, from)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.readlines()
    steps, fence, block, marker, setup = [], None, None, None, None
    for n, line in enumerate(lines, 1):
        if setup is not None:
            if re.match(r"^\s*-->\s*$", line):
                steps.append(setup)
                setup = None
            else:
                setup["text"] += line
            continue
        if fence is not None:
            if re.match(r"^\s*```\s*$", line):
                steps.append(block)
                fence = None
            else:
                block["text"] += re.sub(r"^ {0,%d}" % block["indent"], "", line)
            continue
        m = re.match(r"^(\s*)```\s*(\S*)\s*$", line)
        if m:
            fence = m.group(2).lower()
            kind = "sql" if fence == "sql" else "code" if fence in LANGS else "other"
            block = {"kind": kind, "line": n, "text": "", "indent": len(m.group(1)),
                     "fence": fence, "marker": marker}
            if marker and marker[0] != "norun" and kind != "code":
                raise DocError(f"{path}:{marker[1]}: a {marker[0]} marker must be followed by a "
                               "```js, ```ts or ```python block")
            if marker and marker[0] == "norun" and kind != "sql":
                raise DocError(f"{path}:{marker[1]}: a norun marker must be followed by a ```sql block")
            marker = None
            continue
        m = re.match(r"^\s*<!--\s*(fragment|serves|from|norun):(.*?)-->\s*$", line)
        if m:
            arg = m.group(2).strip()
            if not arg:
                raise DocError(f"{path}:{n}: a {m.group(1)} marker needs "
                               + ("a reason" if m.group(1) in ("fragment", "norun") else "an argument"))
            marker = (m.group(1), n, arg)
            continue
        if re.match(r"^\s*<!--\s*sql-setup\s*$", line):
            setup = {"kind": "setup", "line": n, "text": ""}
            continue
        if marker and line.strip():
            raise DocError(f"{path}:{marker[1]}: a {marker[0]} marker must be followed by a code block")
    if fence is not None:
        raise DocError(f"{path}: a code block is not closed")
    if setup is not None:
        raise DocError(f"{path}:{setup['line']}: a sql-setup comment is not closed")
    return steps


def conn_env(db):
    host = os.environ.get("IDEM_TEST_PGHOST", "127.0.0.1")
    port = os.environ["IDEM_TEST_PGPORT"]
    user = os.environ.get("IDEM_TEST_PGUSER", "postgres")
    return {"PGHOST": host, "PGPORT": port, "PGUSER": user, "PGDATABASE": db,
            "DATABASE_URL": f"postgresql://{user}@{host}:{port}/{db}"}


def psql(db, script):
    env = dict(os.environ, **conn_env(db), PGOPTIONS="-c client_min_messages=warning")
    r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"], input=script,
                       env=env, capture_output=True, text=True, timeout=120)
    return r.returncode == 0, r.stdout + r.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_env(work):
    """A node_modules folder in work where a snippet finds the client and its peers."""
    nm = os.path.join(work, "node_modules")
    os.makedirs(os.path.join(nm, "@idempotency"), exist_ok=True)
    links = {"@idempotency/express": os.path.join(ROOT, "clients/node")}
    for base in (os.path.join(ROOT, "clients/node/node_modules"), os.path.join(HERE, "node_modules")):
        for name in os.listdir(base) if os.path.isdir(base) else []:
            if name.startswith("."):
                continue
            if name.startswith("@"):
                for sub in os.listdir(os.path.join(base, name)):
                    links.setdefault(f"{name}/{sub}", os.path.join(base, name, sub))
            else:
                links.setdefault(name, os.path.join(base, name))
    for name, target in links.items():
        dest = os.path.join(nm, name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not os.path.lexists(dest):
            os.symlink(target, dest)


def prepare(lang, fence, text, work, tag):
    """Writes the program; returns (argv, error)."""
    if lang == "python":
        path = os.path.join(work, f"{tag}.py")
        with open(path, "w") as f:
            f.write(text)
        return [PY, path], None
    if fence in ("ts", "typescript"):
        proj = os.path.join(work, tag)
        os.makedirs(os.path.join(proj, "src"))
        with open(os.path.join(proj, "src", "app.ts"), "w") as f:
            f.write(text)
        with open(os.path.join(proj, "tsconfig.json"), "w") as f:
            json.dump({"compilerOptions": {
                "target": "ES2022", "module": "node16", "moduleResolution": "node16", "strict": True,
                "noEmitOnError": True, "esModuleInterop": True, "preserveSymlinks": True, "skipLibCheck": True,
                "outDir": "dist", "rootDir": "src", "types": ["node"]}, "include": ["src"]}, f)
        tsc = os.path.join(HERE, "node_modules", ".bin", "tsc")
        if not os.path.exists(tsc):
            return None, "tsc not found: npm ci in clients/snippets"
        r = subprocess.run([tsc, "-p", proj], capture_output=True, text=True, timeout=120, cwd=proj)
        if r.returncode != 0:
            return None, "tsc --strict:\n" + r.stdout + r.stderr
        return ["node", os.path.join(proj, "dist", "app.js")], None
    module = re.search(r"^\s*(import\s.*\sfrom\s|export\s)", text, re.M)
    path = os.path.join(work, f"{tag}.{'mjs' if module else 'js'}")
    with open(path, "w") as f:
        f.write(text)
    return ["node", path], None


def relocate(text, program, path, fence_line):
    """The program's own file and line in a message, as the Markdown's."""
    def at(m):
        return f"{path}:{fence_line + int(m.group(1))}"
    text = re.sub(re.escape(program) + r":(\d+)(?::\d+)?", at, text)
    return re.sub(r'File "' + re.escape(program) + r'", line (\d+)', lambda m: f'File "{at(m)}"', text)


def ask(port, method, path, body, key):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, body=body, headers={"Idempotency-Key": key, "Content-Type": "application/json"})
    r = c.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    c.close()
    return out


def wait_listening(proc, port, seconds=30):
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


def run_program(argv, env, serves, cwd):
    """Runs one program; returns an error message or None."""
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def output():
        log.seek(0)
        return log.read()[-4000:]

    if not serves:
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "did not end within 60 s (a server needs a serves marker)\n" + output()
        return None if rc == 0 else f"exited with {rc}:\n{output()}"
    try:
        m = re.match(r"^([A-Z]+)\s+(\S+)\s*(.*)$", serves)
        if not m:
            return f"the serves marker is not METHOD PATH JSON: {serves}"
        method, path, body = m.group(1), m.group(2), m.group(3) or "{}"
        port = int(env["PORT"])
        if not wait_listening(proc, port):
            return f"did not listen on PORT ({port}) within 30 s:\n{output()}"
        key = "snippet-" + uuid.uuid4().hex
        first = ask(port, method, path, body, key)
        if not 200 <= first[0] < 300:
            return f"{method} {path} answered {first[0]}: {first[2][:500]!r}\n{output()}"
        second = ask(port, method, path, body, key)
        if (second[0], second[2]) != (first[0], first[2]) or second[1].get("idempotent-replayed") != "true":
            return (f"the retry with the same key was not a replay: {second[0]} {second[2][:500]!r} "
                    f"(Idempotent-Replayed: {second[1].get('idempotent-replayed')}), first {first[0]} "
                    f"{first[2][:500]!r}\n{output()}")
        return None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def quoted(path, text):
    """None when text is found line for line in path, else an error."""
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):
        return f"the quoted file {path} does not exist"
    with open(full, encoding="utf-8") as f:
        source = [l.rstrip() for l in f.read().splitlines()]
    want = [l.rstrip() for l in text.rstrip("\n").splitlines()]
    for i in range(len(source) - len(want) + 1):
        if source[i:i + len(want)] == want:
            return None
    return f"not found line for line in {path}"


def note(counts, key, line):
    print(line)
    counts[key] += 1


def run_code(block, lang, path, db, work, counts):
    """Runs one block of the language (its SQL before it has run)."""
    where, marker = f"{path}:{block['line']} ({block['fence']})", block["marker"]
    serves = marker[2] if marker and marker[0] == "serves" else None
    if not serves and APP.search(block["text"]):
        return note(counts, "failed", f"not ok - {where}: it makes a web application: give it a serves "
                    "marker (and a listen on PORT) or a fragment marker")
    started = time.monotonic()
    tag = f"{db}_l{block['line']}"
    argv, err = prepare(lang, block["fence"], block["text"], work, tag)
    if not err:
        env = dict(os.environ, **conn_env(db), PORT=str(free_port()),
                   PYTHONPATH=os.path.join(ROOT, "clients/python"))
        err = run_program(argv, env, serves, work)
    if err:
        return note(counts, "failed", f"not ok - {where}: " + (relocate(err, argv[-1], path, block["line"])
                                                             if argv else err))
    what = f"served {serves} and replayed it" if serves else "ran"
    note(counts, "served" if serves else "ran", f"ok - {where}: {what} ({time.monotonic() - started:.1f} s)")


def run_marked(block, path, counts):
    """A fragment or a quote: True when the block was one."""
    where, marker = f"{path}:{block['line']} ({block['fence']})", block["marker"]
    if marker and marker[0] == "fragment":
        note(counts, "fragments", f"fragment - {where}: {marker[2]}")
        return True
    if marker and marker[0] == "from":
        err = quoted(marker[2], block["text"])
        if err:
            note(counts, "failed", f"not ok - {where}: {err}")
        else:
            note(counts, "quoted", f"ok - {where}: quoted from {marker[2]}")
        return True
    return False


def run_file(path, db, lang, work, counts):
    """The blocks of one file in the language: how many there are."""
    try:
        steps = parse(path)
    except DocError as e:
        note(counts, "failed", f"not ok - {e}")
        return 0
    mine = [s for s in steps if s["kind"] == "code" and LANGS[s["fence"]] == lang]
    if not mine:
        return 0
    ok, out = psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE);\nCREATE DATABASE {db};")
    if not ok:
        raise SystemExit(f"cannot create the database {db}: {out}")
    sql_steps = [s for s in steps if s["kind"] == "setup"
                 or (s["kind"] == "sql" and not (s["marker"] and s["marker"][0] == "norun"))]
    creates = any(s["kind"] == "sql" and CREATE_EXTENSION.search(s["text"]) for s in sql_steps)
    sql, sql_from = ("", None) if creates else ("CREATE EXTENSION idempotency CASCADE;\n", 1)
    for s in steps:
        if s in sql_steps:
            sql_from = sql_from or s["line"]
            sql += s["text"] + "\n"
        elif s in mine and not run_marked(s, path, counts):
            if sql:
                ok, out = psql(db, sql)
                sql, sql_from_was, sql_from = "", sql_from, None
                if not ok:
                    note(counts, "failed", f"not ok - {path}:{s['line']} ({s['fence']}): the SQL before it "
                         f"(from {path}:{sql_from_was}) failed:\n{out}")
                    continue
            run_code(s, lang, path, db, work, counts)
    return len(mine)


def main():
    begun = time.monotonic()
    if len(sys.argv) < 2 or sys.argv[1] not in ("node", "python"):
        sys.exit(__doc__)
    lang, files = sys.argv[1], sys.argv[2:] or default_files()
    work = tempfile.mkdtemp(prefix=f"idem-snippets-{lang}-")
    if lang == "node":
        node_env(work)
    counts = {"ran": 0, "served": 0, "quoted": 0, "fragments": 0, "failed": 0}
    try:
        found = sum(run_file(path, f"snippets_{lang}_{n}", lang, work, counts) for n, path in enumerate(files, 1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"RESULT {lang} snippets: {counts['ran']} ran, {counts['served']} served, {counts['quoted']} quoted, "
          f"{counts['fragments']} fragments (not run), {counts['failed']} failed "
          f"({time.monotonic() - begun:.0f} s)")
    # the parser found the snippets: fewer would mean it missed them
    if found < 4:
        note(counts, "failed", f"not ok - only {found} {lang} blocks were found: the extraction missed some")
    sys.exit(1 if counts["failed"] else 0)


if __name__ == "__main__":
    main()
