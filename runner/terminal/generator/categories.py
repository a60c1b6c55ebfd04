"""Task families of everyday terminal work; each draws its parameters from ``rng``.

Every family returns a :class:`TaskSpec` with input files, exact instructions, a
final-state test that fails before and passes after the reference solution, and that
solution as one shell command per line. Pools of words and numbers are combined so the
space of distinct tasks per family is in the thousands or more.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from runner.terminal.generator.spec import HOME, TaskSpec


def _partial(name: str, body: str, args: str = "") -> str:
    """One partial check (see TaskSpec.partial_checks): a test function of ``body``."""
    return f"def test_partial_{name}({args}):\n{body}"


def _text_partials(path: str, expected: str) -> list[str]:
    """Partial checks of a file that must read ``expected``: it exists, and each expected
    line is in its place (all implied by ``Path(path).read_text() == expected``)."""
    checks = [_partial("exists", f"    assert Path({path!r}).is_file()\n")]
    for k, line in enumerate(expected.splitlines()):
        checks.append(
            _partial(
                f"line_{k + 1}",
                f"    lines = Path({path!r}).read_text().splitlines()\n"
                f"    assert len(lines) > {k} and lines[{k}] == {line!r}\n",
            )
        )
    return checks


WORDS = [
    "alpha",
    "bravo",
    "cedar",
    "delta",
    "ember",
    "falcon",
    "garnet",
    "harbor",
    "iris",
    "jasper",
    "kepler",
    "lumen",
    "maple",
    "nova",
    "orchid",
    "pixel",
    "quartz",
    "raven",
    "sierra",
    "tango",
    "umber",
    "velvet",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
    "amber",
    "basalt",
    "cobalt",
    "dune",
    "echo",
    "fjord",
    "glacier",
    "helix",
    "indigo",
    "juniper",
    "krypton",
    "lotus",
    "meadow",
    "nimbus",
]
PROJECTS = [
    "webapp",
    "billing",
    "inventory",
    "analytics",
    "gateway",
    "scheduler",
    "reports",
    "crm",
    "ledger",
    "portal",
]
EXTS = ("txt", "log", "csv", "md", "json", "yaml", "conf", "py")
REGIONS = ["north", "south", "east", "west", "central"]
PRODUCTS = ["widget", "gadget", "bolt", "gear", "valve", "panel", "cable", "sensor"]
DEPTS = ["eng", "ops", "sales", "hr", "finance", "legal"]


def _words(rng: random.Random, n: int) -> list[str]:
    return rng.sample(WORDS, n)


def _difficulty(size: int, small: int) -> str:
    return "easy" if size <= small else "medium"


def archive_create(rng: random.Random) -> TaskSpec:
    proj, sub = rng.choice(PROJECTS), rng.choice(["manifests", "configs", "docs", "scripts"])
    names = [f"{w}.{rng.choice(EXTS)}" for w in _words(rng, rng.randint(2, 5))]
    files = {f"{HOME}/{proj}/{sub}/{n}": f"{n} v{rng.randint(1, 99)}\n" for n in names}
    archive = f"{HOME}/{proj}_{sub}_backup.tar.gz"
    members = sorted(f"{proj}/{sub}/{n}" for n in names)
    return TaskSpec(
        "archive_create",
        _difficulty(len(names), 3),
        f"The directory {HOME}/{proj}/{sub} holds {len(names)} files. Create a gzip-compressed tar "
        f"archive at {archive} that contains that directory, with member paths relative to "
        f"{HOME} (so listing it shows paths like '{members[0]}'). The files themselves must "
        f"stay where they are.",
        f"archive {archive} with members {members}",
        files,
        f"def test_archive():\n"
        f"    assert Path({archive!r}).is_file()\n"
        f"    with tarfile.open({archive!r}, 'r:gz') as tar:\n"
        f"        got = sorted(m.name.lstrip('./') for m in tar.getmembers() if m.isfile())\n"
        f"        assert got == {members!r}\n"
        f"        for m in {members!r}:\n"
        f"            assert tar.extractfile(m).read().decode() == Path({HOME!r}, m).read_text()\n",
        [f"cd {HOME} && tar -czf {archive} {proj}/{sub}"],
        absent=[archive],
        partial_checks=[
            _partial("exists", f"    assert Path({archive!r}).is_file()\n"),
            _partial(
                "members",
                f"    with tarfile.open({archive!r}, 'r:gz') as tar:\n"
                f"        got = sorted(m.name.lstrip('./') for m in tar.getmembers() if m.isfile())\n"
                f"    assert got == {members!r}\n",
            ),
        ],
    )


def archive_extract(rng: random.Random) -> TaskSpec:
    names = [f"{w}.{rng.choice(EXTS)}" for w in _words(rng, rng.randint(2, 5))]
    contents = {n: f"{n}: {rng.randint(100, 999)}\n" for n in names}
    bundle, dest = (
        f"{HOME}/incoming/{rng.choice(PROJECTS)}_{rng.choice(WORDS)}.tar.gz",
        f"{HOME}/{rng.choice(['restore', 'unpacked', 'release'])}",
    )
    post = ["mkdir -p /tmp/bundle_src"]
    for n, c in contents.items():
        post.append(
            f"printf '%s' '{c.rstrip()}' > /tmp/bundle_src/{n} && echo >> /tmp/bundle_src/{n}"
        )
    post += [
        f"mkdir -p {HOME}/incoming",
        f"tar -czf {bundle} -C /tmp/bundle_src .",
        "rm -rf /tmp/bundle_src",
    ]
    return TaskSpec(
        "archive_extract",
        _difficulty(len(names), 3),
        f"Extract the archive {bundle} into the directory {dest} (create it), so that each file "
        f"of the archive ends up directly inside {dest}. Keep the archive.",
        f"{dest} holds {sorted(names)}",
        {},
        f"def test_extracted():\n"
        f"    for name, content in {contents!r}.items():\n"
        f"        assert Path({dest!r}, name).read_text() == content\n"
        f"    assert Path({bundle!r}).is_file()\n",
        [f"mkdir -p {dest}", f"tar -xzf {bundle} -C {dest}"],
        absent=[dest],
        extra_post=post,
        extra_initial=f"\n\ndef test_bundle_present():\n    assert Path({bundle!r}).is_file()\n",
        partial_checks=[
            _partial(f"file_{k + 1}", f"    assert Path({dest!r}, {n!r}).read_text() == {c!r}\n")
            for k, (n, c) in enumerate(contents.items())
        ]
        + [_partial("archive_kept", f"    assert Path({bundle!r}).is_file()\n")],
    )


def text_grep(rng: random.Random) -> TaskSpec:
    word = rng.choice(WORDS)
    lines = []
    for _ in range(rng.randint(8, 40)):
        ws = rng.sample(WORDS, rng.randint(3, 7))
        lines.append(" ".join(ws))
    count = sum(1 for ln in lines if word in ln.split())
    src, out = f"{HOME}/notes/{rng.choice(WORDS)}_journal.txt", f"{HOME}/notes/{word}_count.txt"
    return TaskSpec(
        "text_search",
        _difficulty(len(lines), 20),
        f"Count how many lines of {src} contain the word '{word}' (as a whole word, case-sensitive) "
        f"and write just that number followed by a newline to {out}.",
        str(count),
        {src: "\n".join(lines) + "\n"},
        f"def test_count():\n    assert Path({out!r}).read_text() == '{count}\\n'\n",
        [f"grep -cw '{word}' {src} > {out}"],
        absent=[out],
        partial_checks=_text_partials(out, f"{count}\n"),
    )


def csv_aggregate(rng: random.Random) -> TaskSpec:
    rows = [
        (rng.choice(REGIONS), rng.choice(PRODUCTS), rng.randint(1, 500))
        for _ in range(rng.randint(6, 30))
    ]
    totals: Counter[str] = Counter()
    for region, _, amount in rows:
        totals[region] += amount
    d = f"{HOME}/{rng.choice(PROJECTS)}/{rng.choice(['data', 'exports', 'q1', 'q2', 'q3', 'q4'])}"
    src, out = (
        f"{d}/{rng.choice(WORDS)}_sales.csv",
        f"{d}/{rng.choice(['region_totals', 'totals', 'by_region'])}.csv",
    )
    expected = "region,total\n" + "".join(f"{r},{totals[r]}\n" for r in sorted(totals))
    return TaskSpec(
        "csv_aggregate",
        _difficulty(len(rows), 15),
        f"{src} has a header line 'region,product,amount' and one sale per line. Write {out} with "
        f"the header 'region,total' and then one line 'REGION,TOTAL' per region with the sum of its "
        f"amounts, ordered by region name (A to Z). No spaces, no other lines.",
        expected,
        {src: "region,product,amount\n" + "".join(f"{r},{p},{a}\n" for r, p, a in rows)},
        f"def test_totals():\n    assert Path({out!r}).read_text() == {expected!r}\n",
        [
            f"echo region,total > {out}",
            f"awk -F, 'NR>1 {{s[$1]+=$3}} END {{for (k in s) print k \",\" s[k]}}' {src} | sort >> {out}",
        ],
        absent=[out],
        partial_checks=_text_partials(out, expected),
    )


def json_filter(rng: random.Random) -> TaskSpec:
    import json

    users = [
        {"name": w, "age": rng.randint(18, 70), "active": rng.random() < 0.6}
        for w in _words(rng, rng.randint(4, 12))
    ]
    min_age = rng.choice([21, 25, 30, 35, 40])
    names = sorted(u["name"] for u in users if u["active"] and u["age"] >= min_age)
    d = f"{HOME}/{rng.choice(PROJECTS)}"
    src, out = (
        f"{d}/{rng.choice(['users', 'accounts', 'members'])}.json",
        f"{d}/{rng.choice(WORDS)}_eligible.txt",
    )
    expected = "".join(n + "\n" for n in names)
    return TaskSpec(
        "json_filter",
        _difficulty(len(users), 7),
        f"{src} is a JSON array of objects with keys name, age and active. Write to {out} the names "
        f"of the users that are active and at least {min_age} years old, one per line, sorted A to Z "
        f"(an empty file if there are none).",
        expected,
        {src: json.dumps(users, indent=2) + "\n"},
        f"def test_names():\n    assert Path({out!r}).read_text() == {expected!r}\n",
        [f"jq -r '.[] | select(.active and .age >= {min_age}) | .name' {src} | sort > {out}"],
        absent=[out],
        partial_checks=_text_partials(out, expected),
    )


def log_status(rng: random.Random) -> TaskSpec:
    statuses = rng.sample(
        ["200", "201", "301", "302", "400", "401", "403", "404", "500", "503"], rng.randint(2, 5)
    )
    lines, counts = [], Counter()
    for i in range(rng.randint(10, 50)):
        st = rng.choice(statuses)
        counts[st] += 1
        ip = f"10.0.{rng.randint(0, 9)}.{rng.randint(1, 254)}"
        lines.append(
            f'{ip} - - [02/Dec/2026:10:{i % 60:02d}:00 +0000] "GET /{rng.choice(WORDS)} HTTP/1.1" {st} {rng.randint(100, 9999)}'
        )
    svc = rng.choice(PROJECTS)
    src, out = (
        f"{HOME}/logs/{svc}_access.log",
        f"{HOME}/logs/{svc}_{rng.choice(['status', 'codes', 'summary'])}.txt",
    )
    expected = "".join(f"{s} {counts[s]}\n" for s in sorted(counts))
    return TaskSpec(
        "log_analysis",
        _difficulty(len(lines), 25),
        f"{src} is a web server access log in the common log format. Write {out} with one line "
        f"per HTTP status code that occurs, 'STATUS COUNT' (single space), ordered by status code "
        f"ascending.",
        expected,
        {src: "\n".join(lines) + "\n"},
        f"def test_report():\n    assert Path({out!r}).read_text() == {expected!r}\n",
        [f"awk '{{print $9}}' {src} | sort | uniq -c | awk '{{print $2\" \"$1}}' > {out}"],
        absent=[out],
        partial_checks=_text_partials(out, expected),
    )


def permissions(rng: random.Random) -> TaskSpec:
    d = f"{HOME}/{rng.choice(PROJECTS)}"
    scripts = [f"{d}/{w}.sh" for w in _words(rng, rng.randint(1, 3))]
    confs = [
        f"{d}/{w}.conf" for w in _words(rng, rng.randint(1, 3)) if f"{d}/{w}.sh" not in scripts
    ]
    other = f"{d}/README.md"
    files = (
        {p: "#!/bin/sh\necho ok\n" for p in scripts}
        | {p: "key=value\n" for p in confs}
        | {other: "docs\n"}
    )
    smode, cmode = rng.choice(["750", "755", "700"]), rng.choice(["600", "640"])
    return TaskSpec(
        "permissions",
        _difficulty(len(files), 3),
        f"In {d}, make every *.sh file mode {smode} and every *.conf file mode {cmode}. Leave "
        f"README.md as it is (mode 644).",
        f"sh={smode} conf={cmode}",
        files,
        f"def test_modes():\n"
        f"    for p in {scripts!r}:\n        assert oct(stat.S_IMODE(os.stat(p).st_mode)) == oct(0o{smode})\n"
        f"    for p in {confs!r}:\n        assert oct(stat.S_IMODE(os.stat(p).st_mode)) == oct(0o{cmode})\n"
        f"    assert oct(stat.S_IMODE(os.stat({other!r}).st_mode)) == oct(0o644)\n",
        [f"chmod {smode} {d}/*.sh", f"chmod {cmode} {d}/*.conf"],
        modes={p: "644" for p in files},
        extra_initial=f"\n\ndef test_modes_start_at_644():\n    import os, stat\n"
        f"    for p in {list(files)!r}:\n        assert stat.S_IMODE(os.stat(p).st_mode) == 0o644\n",
        partial_checks=[
            _partial(
                f"mode_{k + 1}",
                f"    assert oct(stat.S_IMODE(os.stat({p!r}).st_mode)) == oct(0o{m})\n",
            )
            for k, (p, m) in enumerate(
                [(p, smode) for p in scripts] + [(p, cmode) for p in confs] + [(other, "644")]
            )
        ],
    )


def find_files(rng: random.Random) -> TaskSpec:
    ext = rng.choice(EXTS)
    root = f"{HOME}/{rng.choice(['workspace', 'archive', 'share'])}"
    files = {}
    for w in _words(rng, rng.randint(5, 14)):
        depth = rng.randint(0, 3)
        sub = "/".join(rng.sample(["a", "b", "c", "d", "e"], depth))
        path = f"{root}/{sub}/{w}.{rng.choice(EXTS)}".replace("//", "/")
        files[path] = f"{w}\n"
    must = f"{root}/x/{rng.choice(WORDS)}.{ext}"
    files[must] = "x\n"
    matches = sorted(p for p in files if p.endswith("." + ext))
    out = f"{HOME}/found_{ext}.txt"
    expected = "".join(p + "\n" for p in matches)
    return TaskSpec(
        "find_files",
        _difficulty(len(files), 8),
        f"Find every regular file under {root} (at any depth) whose name ends in '.{ext}' and write "
        f"their absolute paths to {out}, one per line, sorted in byte order (LC_ALL=C sort).",
        expected,
        files,
        f"def test_list():\n    assert Path({out!r}).read_text() == {expected!r}\n",
        [f"find {root} -type f -name '*.{ext}' | LC_ALL=C sort > {out}"],
        absent=[out],
        partial_checks=_text_partials(out, expected),
    )


def sed_config(rng: random.Random) -> TaskSpec:
    keys = _words(rng, rng.randint(4, 8))
    values = {k: str(rng.randint(1, 9000)) for k in keys}
    target, disable = rng.sample(keys, 2)
    new = str(int(values[target]) + rng.randint(1, 500))
    path = f"{HOME}/etc/{rng.choice(PROJECTS)}.conf"
    before = "".join(f"{k}={values[k]}\n" for k in keys)
    after = "".join(
        f"{k}={new}\n"
        if k == target
        else f"# {k}={values[k]}\n"
        if k == disable
        else f"{k}={values[k]}\n"
        for k in keys
    )
    return TaskSpec(
        "sed_config",
        "easy" if len(keys) < 6 else "medium",
        f"Edit {path} in place: set the value of '{target}' to {new}, and comment out the '{disable}' "
        f"line by putting '# ' (hash and one space) in front of it. Change nothing else.",
        after,
        {path: before},
        f"def test_config():\n    assert Path({path!r}).read_text() == {after!r}\n",
        [f"sed -i -e 's/^{target}=.*/{target}={new}/' -e 's/^{disable}=/# {disable}=/' {path}"],
        partial_checks=_text_partials(path, after),
    )


def awk_columns(rng: random.Random) -> TaskSpec:
    people = [
        (w, rng.choice(DEPTS), rng.randint(30, 200) * 1000) for w in _words(rng, rng.randint(5, 15))
    ]
    dept = rng.choice([p[1] for p in people])
    src, out = (
        f"{HOME}/hr/{rng.choice(['staff', 'people', 'roster'])}_{rng.choice(WORDS)}.txt",
        f"{HOME}/hr/{dept}_salaries.tsv",
    )
    expected = "".join(f"{s}\t{n}\n" for n, d, s in people if d == dept)
    return TaskSpec(
        "awk_columns",
        _difficulty(len(people), 9),
        f"{src} has one employee per line: name, department and salary separated by spaces. For the "
        f"employees of department '{dept}', write to {out} one line per employee, in file order: "
        f"the salary, a tab, then the name.",
        expected,
        {src: "".join(f"{n} {d} {s}\n" for n, d, s in people)},
        f"def test_tsv():\n    assert Path({out!r}).read_text() == {expected!r}\n",
        [f'awk \'$2 == "{dept}" {{print $3 "\\t" $1}}\' {src} > {out}'],
        absent=[out],
        partial_checks=_text_partials(out, expected),
    )


def script_writing(rng: random.Random) -> TaskSpec:
    name = rng.choice(["count", "tally", "measure", "stat"]) + "_" + rng.choice(WORDS)
    script = f"{HOME}/bin/{name}.sh"
    kind = rng.choice(["nonempty", "words", "sum"])
    what = {
        "nonempty": "the number of non-empty lines",
        "words": "the number of words",
        "sum": "the sum of the integers (one per line)",
    }[kind]
    body = {
        "nonempty": 'grep -c . "$1" || true',
        "words": 'wc -w < "$1"',
        "sum": "awk '{s+=$1} END {print s+0}' \"$1\"",
    }[kind]
    cases = []
    for _ in range(3):
        if kind == "sum":
            nums = [rng.randint(-50, 500) for _ in range(rng.randint(1, 6))]
            cases.append(("".join(f"{n}\n" for n in nums), str(sum(nums))))
        else:
            lines = [
                " ".join(rng.sample(WORDS, rng.randint(0, 4))) for _ in range(rng.randint(1, 6))
            ]
            text = "".join(ln + "\n" for ln in lines)
            val = sum(1 for ln in lines if ln) if kind == "nonempty" else len(text.split())
            cases.append((text, str(val)))
    return TaskSpec(
        "script_writing",
        "medium",
        f"Write an executable bash script {script} that takes a file path as its only argument and "
        f"prints {what} in that file, as a bare number followed by a newline, and exits with "
        f"status 0 (also when the number is 0).",
        body,
        {},
        f"def test_script(tmp_path):\n"
        f"    assert os.access({script!r}, os.X_OK)\n"
        f"    for i, (text, want) in enumerate({cases!r}):\n"
        f"        f = tmp_path / f'in{{i}}.txt'\n"
        f"        f.write_text(text)\n"
        f"        out = subprocess.run([{script!r}, str(f)], capture_output=True, text=True, timeout=10)\n"
        f"        assert out.returncode == 0\n"
        f"        assert out.stdout.strip() == want\n",
        [
            f"mkdir -p {HOME}/bin",
            f"printf '%s\\n' '#!/bin/bash' '{body.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}' > {script}",
            f"chmod +x {script}",
        ],
        absent=[script],
        partial_checks=[_partial("executable", f"    assert os.access({script!r}, os.X_OK)\n")]
        + [
            _partial(
                f"case_{i + 1}",
                f"    f = tmp_path / 'in.txt'\n"
                f"    f.write_text({text!r})\n"
                f"    out = subprocess.run([{script!r}, str(f)], capture_output=True, text=True, timeout=10)\n"
                f"    assert out.returncode == 0 and out.stdout.strip() == {want!r}\n",
                "tmp_path",
            )
            for i, (text, want) in enumerate(cases)
        ],
    )


def processes(rng: random.Random) -> TaskSpec:
    name = rng.choice(["worker", "poller", "collector", "agent"]) + "_" + rng.choice(WORDS)
    app = f"{HOME}/app"
    script, pidfile = f"{app}/{name}.sh", f"{app}/{name}.pid"
    beat = rng.choice([1, 2, 3])
    files = {
        script: f"#!/bin/bash\nwhile true; do date +%s > {app}/{name}.beat; sleep {beat}; done\n"
    }
    return TaskSpec(
        "processes",
        "medium",
        f"Start {script} as a background process that keeps running after your command returns "
        f"(its output can be discarded), and write its process id to {pidfile}.",
        pidfile,
        files,
        f"def test_running():\n"
        f"    pid = int(Path({pidfile!r}).read_text().strip())\n"
        f"    cmdline = Path(f'/proc/{{pid}}/cmdline').read_bytes().decode()\n"
        f"    assert {script!r} in cmdline\n",
        [f"nohup {script} >/dev/null 2>&1 & echo $! > {pidfile}"],
        modes={script: "755"},
        absent=[pidfile],
        partial_checks=[
            _partial("pidfile", f"    assert int(Path({pidfile!r}).read_text().strip()) > 0\n")
        ],
    )


def symlinks(rng: random.Random) -> TaskSpec:
    versions = sorted(
        {
            f"{rng.randint(1, 3)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}"
            for _ in range(rng.randint(2, 5))
        },
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )
    rel = f"{HOME}/{rng.choice(PROJECTS)}/releases"
    files = {f"{rel}/v{v}/VERSION": f"{v}\n" for v in versions}
    newest = f"{rel}/v{versions[-1]}"
    link = f"{HOME}/{rng.choice(['current', 'live', 'active', 'stable'])}_{rng.choice(WORDS)}"
    return TaskSpec(
        "symlinks",
        _difficulty(len(versions), 3),
        f"{rel} holds one directory per release (v<major>.<minor>.<patch>). Create a symbolic link "
        f"{link} that points to the absolute path of the newest release directory (highest version "
        f"by numeric comparison).",
        newest,
        files,
        f"def test_link():\n    assert os.path.islink({link!r})\n    assert os.readlink({link!r}) == {newest!r}\n",
        [f"ln -sfn {newest} {link}"],
        absent=[link],
        partial_checks=[_partial("is_link", f"    assert os.path.islink({link!r})\n")],
    )


def dedupe_sort(rng: random.Random) -> TaskSpec:
    pool = _words(rng, rng.randint(4, 10))
    lines = [rng.choice(pool) for _ in range(rng.randint(8, 30))]
    d = f"{HOME}/{rng.choice(['lists', 'inventory', 'tags', 'hosts'])}"
    src, out = f"{d}/{rng.choice(WORDS)}_raw.txt", f"{d}/{rng.choice(WORDS)}_unique.txt"
    expected = "".join(w + "\n" for w in sorted(set(lines)))
    return TaskSpec(
        "dedupe_sort",
        _difficulty(len(lines), 15),
        f"Write to {out} every distinct line of {src} exactly once, sorted A to Z.",
        expected,
        {src: "".join(w + "\n" for w in lines)},
        f"def test_unique():\n    assert Path({out!r}).read_text() == {expected!r}\n",
        [f"sort -u {src} > {out}"],
        absent=[out],
        partial_checks=_text_partials(out, expected),
    )


CATEGORIES: dict[str, Callable[[random.Random], TaskSpec]] = {
    "archive_create": archive_create,
    "archive_extract": archive_extract,
    "text_search": text_grep,
    "csv_aggregate": csv_aggregate,
    "json_filter": json_filter,
    "log_analysis": log_status,
    "permissions": permissions,
    "find_files": find_files,
    "sed_config": sed_config,
    "awk_columns": awk_columns,
    "script_writing": script_writing,
    "processes": processes,
    "symlinks": symlinks,
    "dedupe_sort": dedupe_sort,
}
