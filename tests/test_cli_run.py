"""``ascend-patch run``: the real CLI in a subprocess runs programs exactly as ``python`` does,
patched before their first line, in the main process and in every process they start.

A probe plugin is "installed" by putting its module and a ``.dist-info`` directory on
PYTHONPATH (importlib.metadata finds it there, in this process's children too); it
replaces ``apx_run_target.where()`` -> ``"original"`` with one returning ``"patched"``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_patch_core._cli import bootstrap as _bootstrap
from ascend_patch_core._cli import commands as _cli
from ascend_patch_core._cli import run as _run


BIN = Path(sys.executable).parent
CLI = BIN / "ascend-patch"

PROBE_PLUGIN = {
    "apx_run_plugin.py": """
        from ascend_patch_core import AtomicPatch, hookimpl


        def patched_where():
            return "patched"


        @hookimpl
        def register_patches():
            # A runtime_check gives the patch call counters, which the run report carries.
            return [AtomicPatch("apx_run_target.where", "apx_run_plugin:patched_where", runtime_check=lambda: True)]
        """,
    "apx_run_target.py": """
        def where():
            return "original"
        """,
}

BROKEN_PLUGIN = {
    "apx_run_broken.py": """
        from ascend_patch_core import hookimpl


        @hookimpl
        def register_patches():
            raise RuntimeError("this plugin is broken on purpose")
        """,
}


def write_plugin(
    site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]
) -> None:
    """Install a plugin distribution the way importlib.metadata sees one: a .dist-info on sys.path."""
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[ascend_patch]\n{lines}")
    for name, source in modules.items():
        (site / name).write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A directory on the children's PYTHONPATH holding the probe plugin (and a broken one)."""
    root = tmp_path / "site"
    root.mkdir()
    write_plugin(root, "apx-run", {"apx_run": "apx_run_plugin"}, PROBE_PLUGIN)
    write_plugin(root, "apx-run-broken", {"apx_run_broken": "apx_run_broken"}, BROKEN_PLUGIN)
    return root


def clean_env(tmp_path: Path, site: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env


def cli(*args: str) -> list[str]:
    if CLI.exists():
        return [str(CLI), *args]
    return [sys.executable, "-m", "ascend_patch_core._cli", *args]


def run(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


#: How the one line starts that run says when torch_npu is missing and no --emulate-npu
#: (docs/cli-reference.md): the launcher's, before the program's first line -- not the program's output.
REDIRECT_NOTE = "ascend-patch run: note: torch_npu is not installed"


def program_stderr(stderr: str) -> str:
    """run's stderr without the launcher's note on inactive redirects (said at most once)."""
    lines = stderr.splitlines(keepends=True)
    assert sum(line.startswith(REDIRECT_NOTE) for line in lines) <= 1, stderr
    return "".join(line for line in lines if not line.startswith(REDIRECT_NOTE))


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


# ---------------------------------------------------------------------------- the command line


@given(
    program_args=st.lists(
        st.sampled_from(["--strict", "-m", "x", "--report", "--", "-v", "a b", "--disable=y", "-"]),
        max_size=6,
    )
)
def test_everything_after_the_script_belongs_to_the_program(program_args: list[str]) -> None:
    """split_argv: options before the script are run's, everything after it -- even run's own option names -- the program's."""
    own, target = _run.split_argv(["--strict", "--report", "r.json", "train.py", *program_args])

    assert own == ["--strict", "--report", "r.json"]
    assert target == _run.RunTarget("script", "train.py", tuple(program_args))


@pytest.mark.parametrize(
    ("argv", "own", "target"),
    [
        (["-m", "pkg.mod", "--x", "1"], [], _run.RunTarget("module", "pkg.mod", ("--x", "1"))),
        (["-mpkg.mod", "a"], [], _run.RunTarget("module", "pkg.mod", ("a",))),
        (
            ["--disable", "a,b", "-v", "s.py"],
            ["--disable", "a,b", "-v"],
            _run.RunTarget("script", "s.py", ()),
        ),
        (
            ["--emulate-npu", "s.py", "-m"],
            ["--emulate-npu"],
            _run.RunTarget("script", "s.py", ("-m",)),
        ),
        (["--", "-odd-name.py", "x"], [], _run.RunTarget("script", "-odd-name.py", ("x",))),
        (["--strict"], ["--strict"], None),
    ],
)
def test_split_argv_cases(argv: list[str], own: list[str], target: _run.RunTarget | None) -> None:
    """split_argv handles -m in both spellings, value options, flags, '--', and a missing program."""
    assert _run.split_argv(argv) == (own, target)


def test_every_option_is_parsed_into_the_options_children_receive(tmp_path: Path) -> None:
    """The run options (including --emulate-npu=VERSION) become RunOptions, and survive the JSON trip to children."""
    _, run_parser = _cli._parser()
    own, target = _run.split_argv(
        [
            "--disable",
            "a,b",
            "--disable",
            "c",
            "--plugins",
            "torch",
            "--emulate-npu=2.14.0",
            "--report",
            str(tmp_path / "r.json"),
            "--profile",
            str(tmp_path / "prof"),
            "--brake-at",
            "5",
            "--strict",
            "train.py",
            "--lr",
            "1",
        ]
    )
    options = _run.options_from_args(run_parser.parse_args(own))

    assert target == _run.RunTarget("script", "train.py", ("--lr", "1"))
    assert options == _bootstrap.RunOptions(
        disable=("a", "b", "c"),
        plugins=("torch",),
        strict=True,
        emulate_npu=True,
        npu_version="2.14.0",
        profile=str(tmp_path / "prof"),
        brake_at=5,
        report=str(tmp_path / "r.json"),
    )
    assert _bootstrap.RunOptions.from_env(options.to_env()) == options
    bare = _run.options_from_args(run_parser.parse_args(["--emulate-npu"]))
    assert bare.emulate_npu is True and bare.npu_version is None


@pytest.mark.parametrize("value", ["1", "true", "ON", " 1 "])
def test_the_variable_accepts_a_plain_switch(value: str) -> None:
    """ASCEND_PATCH_RUN=1 (for launchers that cannot be wrapped) means default options; 0 and empty mean off."""
    assert _bootstrap.RunOptions.from_env(value) == _bootstrap.RunOptions()
    assert _bootstrap.RunOptions.from_env("0") is None
    assert _bootstrap.RunOptions.from_env("") is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{not json", "expected 1 or a JSON object"),
        ("[1]", "expected a JSON object"),
        ('{"brake_at": "5"}', "'brake_at' must be int"),
        ('{"disable": [1]}', "'disable' must be a list of strings"),
        ('{"strict": 1}', "'strict' must be bool"),
    ],
)
def test_a_malformed_variable_is_rejected_with_the_reason(value: str, message: str) -> None:
    """A malformed ASCEND_PATCH_RUN raises ValueError naming what is wrong (the hook prints it and starts nothing)."""
    with pytest.raises(ValueError, match=message):
        _bootstrap.RunOptions.from_env(value)


def test_usage_errors(tmp_path: Path) -> None:
    """No program, a missing script, a missing module, a bad --brake-at: clear messages and python's exit statuses."""
    env = clean_env(tmp_path)
    nothing = run(cli("run", "--strict"), tmp_path, env)
    missing = run(cli("run", "nosuch.py"), tmp_path, env)
    python_missing = run([sys.executable, "nosuch.py"], tmp_path, env)
    module = run(cli("run", "-m", "apx_no_such_module"), tmp_path, env)
    python_module = run([sys.executable, "-m", "apx_no_such_module"], tmp_path, env)
    brake = run(cli("run", "--brake-at", "0", "x.py"), tmp_path, env)
    not_python = run(cli("run", "sh", "-c", "true"), tmp_path, env)

    assert nothing.returncode == 2 and "give the program to run" in nothing.stderr
    assert missing.returncode == python_missing.returncode == 2
    assert "can't open file" in missing.stderr and "nosuch.py" in missing.stderr
    assert module.returncode == python_module.returncode == 1
    assert "No module named apx_no_such_module" in module.stderr
    assert brake.returncode == 2 and "--brake-at must be a positive number" in brake.stderr
    assert not_python.returncode == 2 and "is not a Python script" in not_python.stderr


@pytest.mark.parametrize(
    "value", ["maybe", "{not json", '{"strict": 3}', '["a"]'], ids=["word", "json", "type", "list"]
)
def test_a_malformed_variable_is_reported_once_per_process(tmp_path: Path, value: str) -> None:
    """A bad ASCEND_PATCH_RUN prints its message once (site may read site-packages twice), under
    python and under ascend-patch run (whose own options then go to the children)."""
    write(tmp_path / "prog.py", "print('ran')\n")
    env = clean_env(tmp_path, ASCEND_PATCH_RUN=value)

    plain = run([sys.executable, "prog.py"], tmp_path, env)
    wrapped = run(cli("run", "prog.py"), tmp_path, env)

    for done in (plain, wrapped):
        assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
        assert done.stderr.count(f"{_bootstrap.ENV_VAR} is ignored") == 1, done.stderr
        assert len(program_stderr(done.stderr).splitlines()) == 1, done.stderr


def test_a_report_path_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    """--report to a directory (or below a file) is a usage error naming the path, before the
    program runs; a report that fails at exit names its path too."""
    (tmp_path / "reports").mkdir()
    (tmp_path / "afile").write_text("")
    write(tmp_path / "prog.py", "print('ran')\n")
    # The program makes the report's path a directory: the write at exit fails.
    write(tmp_path / "spoil.py", "import os\nos.mkdir('late.json')\n")
    env = clean_env(tmp_path)

    directory = run(cli("run", "--report", "reports", "prog.py"), tmp_path, env)
    below_file = run(cli("run", "--report", "afile/r.json", "prog.py"), tmp_path, env)
    late = run(cli("run", "--report", "late.json", "spoil.py"), tmp_path, env)

    assert (directory.returncode, directory.stdout) == (2, "")
    assert f"--report {tmp_path / 'reports'}: is a directory" in directory.stderr
    assert (below_file.returncode, below_file.stdout) == (2, "")
    assert f"{tmp_path / 'afile'} is not a directory" in below_file.stderr
    assert late.returncode == 0
    assert f"could not write the run report to {tmp_path / 'late.json'}: IsADirectoryError" in (
        late.stderr
    )


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("x = (1\n", id="unclosed"),
        pytest.param("def f():\nreturn 1\n", id="indentation"),
        pytest.param("print('a')\nif True\n    pass\n", id="after-a-line"),
        pytest.param("x = 1\n\tdef g(): pass\n", id="tab"),
        pytest.param("x = " + " + ".join(["a"] * 5000) + "\n", id="too-deep-to-compile"),
    ],
)
def test_a_script_that_does_not_compile_shows_what_python_shows(
    tmp_path: Path, source: str
) -> None:
    """A SyntaxError (or a file too deep to compile): python's output exactly, status 1, no launcher frames."""
    write(tmp_path / "prog.py", source)
    env = clean_env(tmp_path)

    expected = run([sys.executable, "prog.py"], tmp_path, env)
    got = run(cli("run", "prog.py"), tmp_path, env)

    assert expected.returncode == 1
    assert (got.returncode, got.stdout, got.stderr) == (1, expected.stdout, expected.stderr)


@pytest.mark.parametrize("how", [["-m", "prog"], ["-m", "pkg"], ["appdir"]], ids=str)
def test_a_module_that_does_not_compile_shows_the_error_once(
    tmp_path: Path, how: list[str]
) -> None:
    """-m and directories: the error as python -m shows it (its frames, not the launcher's), once, status 1."""
    write(tmp_path / "prog.py", "x = (1\n")
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "__main__.py", "x = (1\n")
    write(tmp_path / "appdir" / "__main__.py", "x = (1\n")
    env = clean_env(tmp_path)

    expected = run([sys.executable, *how], tmp_path, env)
    got = run(cli("run", *how), tmp_path, env)

    assert expected.returncode == got.returncode == 1
    assert got.stdout == ""
    assert got.stderr.count("SyntaxError: '(' was never closed") == 1
    assert "ascend_patch_core" not in got.stderr and "ascend-patch" not in got.stderr
    tail = expected.stderr.splitlines()[-4:]  # File "...", line 1 / source / caret / error
    assert got.stderr.splitlines()[-4:] == tail


def test_a_package_that_raises_on_lookup_shows_python_s_traceback(tmp_path: Path) -> None:
    """-m pkg.mod whose package raises while python -m looks it up: its traceback, status 1, no launcher frames."""
    write(tmp_path / "boom" / "__init__.py", "raise RuntimeError('boom at import')\n")
    write(tmp_path / "boom" / "mod.py", "print('never')\n")
    env = clean_env(tmp_path)

    expected = run([sys.executable, "-m", "boom.mod"], tmp_path, env)
    got = run(cli("run", "-m", "boom.mod"), tmp_path, env)

    assert expected.returncode == got.returncode == 1
    assert got.stdout == ""
    assert "ascend_patch_core" not in got.stderr
    assert got.stderr.splitlines()[-3:] == expected.stderr.splitlines()[-3:]
    assert got.stderr.count("RuntimeError: boom at import") == 1


# ---------------------------------------------------------------------------- python parity

_SHOW = """
import json, sys, __main__
spec = __main__.__spec__
print(json.dumps({
    "argv": sys.argv,
    "path0": sys.path[0],
    "name": __name__,
    "file": __main__.__file__,
    "spec": None if spec is None else [spec.name, spec.origin],
    "package": __main__.__package__,
    "loader": type(__main__.__loader__).__name__,
    "cached": __main__.__cached__,
    "main_is_module": sys.modules["__main__"] is __main__ and __main__.__dict__ is globals(),
    "globals": sorted(globals()),
}))
"""


@pytest.mark.parametrize(
    "how",
    [
        pytest.param(["sub/show.py", "a", "--b"], id="relative-script"),
        pytest.param(["{abs}/sub/show.py", "x"], id="absolute-script"),
        pytest.param(["link.py", "y"], id="symlinked-script"),
        pytest.param(["-m", "show", "z"], id="module"),
        pytest.param(["-m", "pkg", "p"], id="package-main"),
        pytest.param(["appdir", "d"], id="directory"),
    ],
)
def test_the_program_sees_what_python_shows_it(tmp_path: Path, how: list[str]) -> None:
    """sys.argv, sys.path[0], __name__, __file__, __spec__, __package__, __loader__ and __main__'s globals match python's."""
    write(tmp_path / "sub" / "show.py", _SHOW)
    write(tmp_path / "show.py", _SHOW)
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "__main__.py", _SHOW)
    write(tmp_path / "appdir" / "__main__.py", _SHOW)
    (tmp_path / "link.py").symlink_to(tmp_path / "sub" / "show.py")
    args = [a.replace("{abs}", str(tmp_path)) for a in how]
    env = clean_env(tmp_path)

    expected = run([sys.executable, *args], tmp_path, env)
    got = run(cli("run", *args), tmp_path, env)

    assert expected.returncode == 0, expected.stderr
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == json.loads(expected.stdout)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("print('done')", 0),
        ("import sys; sys.exit(3)", 3),
        ("import sys; sys.exit('bye')", 1),
        ("import sys; sys.exit(None)", 0),
        ("raise SystemExit(True)", 1),
        ("def f():\n    raise ValueError('boom')\nf()", 1),
        ("import atexit; atexit.register(print, 'exit handler'); raise KeyError('k')", 1),
        ("raise KeyboardInterrupt", -2),
    ],
)
def test_exit_status_output_and_traceback_match_python(
    tmp_path: Path, body: str, status: int
) -> None:
    """Exit statuses (SystemExit codes, 1 for an uncaught exception, SIGINT death) and stdout/stderr equal python's."""
    write(tmp_path / "prog.py", body + "\n")
    env = clean_env(tmp_path)

    expected = run([sys.executable, "prog.py"], tmp_path, env)
    got = run(cli("run", "prog.py"), tmp_path, env)

    assert expected.returncode == status
    assert (got.returncode, got.stdout, program_stderr(got.stderr)) == (
        expected.returncode,
        expected.stdout,
        expected.stderr,
    )


def test_custom_excepthook_is_used(tmp_path: Path) -> None:
    """An uncaught exception goes through the program's own sys.excepthook, as under python."""
    write(
        tmp_path / "prog.py",
        """
        import sys
        sys.excepthook = lambda kind, value, tb: print("hooked:", kind.__name__, value, file=sys.stderr)
        raise RuntimeError("x")
        """,
    )
    got = run(cli("run", "prog.py"), tmp_path, clean_env(tmp_path))

    assert (got.returncode, program_stderr(got.stderr)) == (1, "hooked: RuntimeError x\n")


# ---------------------------------------------------------------------------- patched everywhere

_SPAWN_PROBE = """
import json, multiprocessing as mp, os, sys
import apx_run_target


def child(queue):
    queue.put((os.getpid(), apx_run_target.where()))


if __name__ == "__main__":
    mp.set_start_method("spawn")
    queue = mp.Queue()
    workers = [mp.Process(target=child, args=(queue,)) for _ in range(2)]
    for w in workers:
        w.start()
    seen = dict(queue.get(timeout=60) for _ in workers)
    for w in workers:
        w.join()
    print(json.dumps({"main": apx_run_target.where(), "children": sorted(seen.values()), "pids": len(seen)}))
"""


def test_patched_in_the_main_process_and_in_spawned_children_with_a_report(
    tmp_path: Path, site: Path
) -> None:
    """The main process and two multiprocessing spawn children all run the patch; --report lists the three processes."""
    write(tmp_path / "probe.py", _SPAWN_PROBE)
    report = tmp_path / "out" / "report.json"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = clean_env(tmp_path, site, TMPDIR=str(scratch))

    done = run(
        cli("run", "--plugins", "apx_run", "--report", str(report), "probe.py"), tmp_path, env
    )

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "main": "patched",
        "children": ["patched", "patched"],
        "pids": 2,
    }
    data = json.loads(report.read_text())
    assert data["schema"] == "ascend-patch-run/1"
    assert data["exit_status"] == 0
    assert data["options"]["plugins"] == ["apx_run"]
    processes = data["processes"]
    assert [p["role"] for p in processes] == ["main", "child", "child"]
    for process in processes:
        record = next(r for r in process["report"]["records"] if r["kind"] == "patch")
        assert record["target"] == "apx_run_target.where"
        assert record["status"] == "applied"
        assert record["provenance"]["distribution"] == "apx-run"
        assert record["counters"]["replacement_calls"] == 1  # one where() call in each process
        plugins = {
            r["name"]: r["status"] for r in process["report"]["records"] if r["kind"] == "plugin"
        }
        assert plugins["apx_run"] == "applied"
        assert plugins["apx_run_broken"] == "skipped"  # not in --plugins, so never imported
    assert processes[0]["argv"] == ["probe.py"]
    assert list(scratch.iterdir()) == []  # the children's report parts were merged and removed


def test_disable_keeps_the_plugin_out_of_every_process(tmp_path: Path, site: Path) -> None:
    """--disable PLUGIN: neither the main process nor its children are patched by it."""
    write(tmp_path / "probe.py", _SPAWN_PROBE)

    done = run(
        cli("run", "--disable", "apx_run,apx_run_broken", "--plugins", "apx_run", "probe.py"),
        tmp_path,
        clean_env(tmp_path, site),
    )

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "main": "original",
        "children": ["original", "original"],
        "pids": 2,
    }


def test_exit_status_is_in_the_report(tmp_path: Path, site: Path) -> None:
    """The run report records the program's exit status (here sys.exit(7))."""
    write(tmp_path / "prog.py", "import apx_run_target, sys\napx_run_target.where()\nsys.exit(7)\n")
    report = tmp_path / "r.json"

    done = run(
        cli("run", "--plugins", "apx_run", "--report", str(report), "prog.py"),
        tmp_path,
        clean_env(tmp_path, site),
    )

    assert done.returncode == 7
    data = json.loads(report.read_text())
    assert data["exit_status"] == 7
    assert [p["role"] for p in data["processes"]] == ["main"]


def test_strict_stops_before_the_program_when_a_plugin_is_broken(
    tmp_path: Path, site: Path
) -> None:
    """--strict: a broken plugin stops the run with its reason; without it the program runs, patched by the healthy plugin."""
    write(tmp_path / "prog.py", "import apx_run_target\nprint(apx_run_target.where())\n")
    env = clean_env(tmp_path, site)

    strict = run(cli("run", "--strict", "prog.py"), tmp_path, env)
    lenient = run(cli("run", "-v", "prog.py"), tmp_path, env)

    assert strict.returncode == 1
    assert strict.stdout == ""
    assert "this plugin is broken on purpose" in strict.stderr
    assert lenient.returncode == 0, lenient.stderr
    assert lenient.stdout == "patched\n"
    assert "this plugin is broken on purpose" in lenient.stderr  # -v prints the report at exit


def test_a_broken_plugin_says_one_line_without_verbose(tmp_path: Path, site: Path) -> None:
    """Not strict, not -v: one stderr line names the broken plugin, what broke and how to see more;
    the program runs, patched by the healthy plugin, and its own output is untouched."""
    write(tmp_path / "prog.py", "import apx_run_target\nprint(apx_run_target.where())\n")

    done = run(cli("run", "prog.py"), tmp_path, clean_env(tmp_path, site))

    assert done.returncode == 0, done.stderr
    assert done.stdout == "patched\n"
    lines = program_stderr(done.stderr).splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "ascend-patch run: plugin 'apx_run_broken' from apx-run-broken 0.1.0"
    )
    assert "register_patches raised RuntimeError: this plugin is broken on purpose" in lines[0]
    assert "-v prints the report" in lines[0] and "--strict" in lines[0]


def test_strict_child_does_not_run_unpatched(tmp_path: Path, site: Path) -> None:
    """Under a strict ASCEND_PATCH_RUN, a child whose patching fails exits 1 before its first line."""
    env = clean_env(tmp_path, site, ASCEND_PATCH_RUN=_bootstrap.RunOptions(strict=True).to_env())

    done = run([sys.executable, "-c", "print('ran')"], tmp_path, env)

    assert done.returncode == 1
    assert done.stdout == ""
    assert "start hook" in done.stderr and "this plugin is broken on purpose" in done.stderr


# ---------------------------------------------------------------------------- the start hook


def _site_packages() -> list[Path]:
    import site as site_module

    return [Path(p) for p in site_module.getsitepackages()]


def test_the_start_hook_is_installed_in_this_environment() -> None:
    """The (editable) install put ascend_patch_core_start.pth into site-packages, with the text the core expects."""
    installed = [
        d / _bootstrap.PTH_NAME for d in _site_packages() if (d / _bootstrap.PTH_NAME).exists()
    ]

    assert installed, (
        f"{_bootstrap.PTH_NAME} is not in {sys.prefix}'s site-packages: reinstall the project "
        "(python3 dev.py test reinstalls it; the build backend adds the hook)"
    )
    assert installed[0].read_text() == _bootstrap.PTH_TEXT
    assert len(installed) == 1
    # The installed package carries no second copy: the hook lives at the wheel root only.
    assert not Path(_bootstrap.__file__).with_name(_bootstrap.PTH_NAME).exists()


def test_the_start_hook_source_file_is_the_text_the_core_expects() -> None:
    """start_hook/ascend_patch_core_start.pth (what the wheel installs) equals _bootstrap.PTH_TEXT."""
    source = Path(__file__).resolve().parent.parent / "start_hook" / _bootstrap.PTH_NAME
    assert source.read_text() == _bootstrap.PTH_TEXT
    assert _bootstrap.ENV_VAR in _bootstrap.PTH_TEXT


def test_the_hook_does_nothing_without_the_variable(tmp_path: Path, site: Path) -> None:
    """Without ASCEND_PATCH_RUN a new interpreter does not even import ascend_patch_core; with it, it is patched."""
    probe = "import sys, apx_run_target; print('ascend_patch_core' in sys.modules, apx_run_target.where())"
    off = run([sys.executable, "-c", probe], tmp_path, clean_env(tmp_path, site))
    on = run(
        [sys.executable, "-c", probe],
        tmp_path,
        clean_env(tmp_path, site, ASCEND_PATCH_RUN="1", ASCEND_PATCH_PLUGINS="apx_run"),
    )

    assert (off.returncode, off.stdout) == (0, "False original\n")
    assert (on.returncode, on.stdout) == (0, "True patched\n"), on.stderr


def test_a_user_sitecustomize_still_runs(tmp_path: Path, site: Path) -> None:
    """The hook does not displace sitecustomize: the user's runs, and the process is patched before it."""
    write(
        site / "sitecustomize.py",
        """
        import apx_run_target
        print("user sitecustomize sees", apx_run_target.where())
        """,
    )
    env = clean_env(tmp_path, site, ASCEND_PATCH_RUN="1", ASCEND_PATCH_PLUGINS="apx_run")

    done = run(
        [sys.executable, "-c", "import apx_run_target; print(apx_run_target.where())"],
        tmp_path,
        env,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout == "user sitecustomize sees patched\npatched\n"


def test_an_inherited_variable_with_other_options_is_refused(tmp_path: Path, site: Path) -> None:
    """ascend-patch run started below another one with different options says so instead of mixing them."""
    write(tmp_path / "prog.py", "print('ran')\n")
    env = clean_env(tmp_path, site, ASCEND_PATCH_RUN=_bootstrap.RunOptions(disable=("x",)).to_env())
    same = clean_env(
        tmp_path, site, ASCEND_PATCH_RUN=_bootstrap.RunOptions(plugins=("apx_run",)).to_env()
    )

    refused = run(cli("run", "prog.py"), tmp_path, env)
    accepted = run(cli("run", "--plugins", "apx_run", "prog.py"), tmp_path, same)

    assert refused.returncode == 2 and "already patched at start-up" in refused.stderr
    assert (accepted.returncode, accepted.stdout) == (0, "ran\n"), accepted.stderr


# ---------------------------------------------------------------------------- torch: workers, ranks, emulator

_DATALOADER_PROBE = """
import json, os
import torch
from torch.utils.data import DataLoader, Dataset
import apx_run_target


class Probe(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return apx_run_target.where(), os.getpid()


if __name__ == "__main__":
    loader = DataLoader(Probe(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    answers, pids = set(), set()
    for where, pid in loader:
        answers.update(where)
        pids.update(int(p) for p in pid)
    assert answers == {"patched"}, answers
    assert len(pids) == 2 and os.getpid() not in pids, pids
    print(json.dumps({"main": apx_run_target.where(), "workers": sorted(answers), "worker_pids": len(pids)}))
"""


@pytest.mark.slow
def test_spawned_dataloader_workers_are_patched(tmp_path: Path, site: Path) -> None:
    """Two DataLoader workers with the spawn start method run the patched function."""
    write(tmp_path / "train.py", _DATALOADER_PROBE)

    done = run(
        cli("run", "--plugins", "apx_run", "train.py"),
        tmp_path,
        clean_env(tmp_path, site),
        timeout=300,
    )

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "main": "patched",
        "workers": ["patched"],
        "worker_pids": 2,
    }


_RANK_PROBE = """
import json, os, sys
import torch
import torch.distributed as dist
import apx_run_target

dist.init_process_group("gloo")
patched = torch.tensor([1 if apx_run_target.where() == "patched" else 0])
dist.all_reduce(patched)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as fh:
        json.dump({"patched_ranks": int(patched.item()), "world_size": dist.get_world_size()}, fh)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(["-m", "torch.distributed.run"], id="run-m-torch.distributed.run"),
        pytest.param(["torchrun"], id="run-torchrun"),
    ],
)
def test_every_torchrun_rank_is_patched(tmp_path: Path, site: Path, launcher: list[str]) -> None:
    """torchrun --nproc-per-node 2 under ascend-patch run (both spellings): both gloo ranks run the patch."""
    write(tmp_path / "ranks.py", _RANK_PROBE)
    result = tmp_path / "result.json"
    env = clean_env(tmp_path, site, OMP_NUM_THREADS="1")
    args = ["--standalone", "--nproc-per-node", "2", "ranks.py", str(result)]

    done = run(cli("run", "--plugins", "apx_run", *launcher, *args), tmp_path, env, timeout=300)

    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(result.read_text()) == {"patched_ranks": 2, "world_size": 2}


@pytest.mark.slow
def test_emulate_npu_makes_torch_npu_work_in_the_program(tmp_path: Path) -> None:
    """--emulate-npu: the unmodified program imports torch_npu and computes on an (emulated) NPU device."""
    write(
        tmp_path / "npu.py",
        """
        import torch, torch_npu
        x = torch.ones(3, device="npu") * 2
        print(torch.npu.is_available(), x.sum().item())
        """,
    )

    done = run(
        cli("run", "--plugins", "torch", "--emulate-npu", "npu.py"),
        tmp_path,
        clean_env(tmp_path),
        timeout=300,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True 6.0"


def test_emulate_npu_with_an_unknown_version_is_a_clear_error(tmp_path: Path) -> None:
    """--emulate-npu=VERSION that cannot be emulated stops before the program, naming the problem."""
    write(tmp_path / "prog.py", "print('ran')\n")

    done = run(
        cli("run", "--emulate-npu=0.0.1", "prog.py"), tmp_path, clean_env(tmp_path), timeout=300
    )

    assert done.returncode == 2
    assert done.stdout == ""
    assert "--emulate-npu" in done.stderr


def test_profile_and_brake_reach_the_patcher_and_the_children(tmp_path: Path, site: Path) -> None:
    """--profile DIR and --brake-at N are given to default_patcher (its training records) and exported to children."""
    write(
        tmp_path / "prog.py",
        """
        import json, os
        import ascend_patch_core
        settings = [r.kind for r in ascend_patch_core.default_patcher.report.records if r.kind == "setting"]
        print(json.dumps({"env": json.loads(os.environ["ASCEND_PATCH_RUN"]), "settings": len(settings)}))
        """,
    )

    done = run(
        cli("run", "--plugins", "apx_run", "--profile", "prof", "--brake-at", "3", "prog.py"),
        tmp_path,
        clean_env(tmp_path, site),
    )

    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    assert data["env"]["profile"] == str(tmp_path / "prof")
    assert data["env"]["brake_at"] == 3
    assert data["settings"] >= 1


def test_a_python_script_on_path_runs_in_process(tmp_path: Path, site: Path) -> None:
    """`ascend-patch run NAME` finds a Python console script on PATH (like torchrun) and runs it patched."""
    bindir = tmp_path / "bin"
    write(
        bindir / "apx-tool",
        f"#!{sys.executable}\nimport sys, apx_run_target\nprint(sys.argv[0], apx_run_target.where())\n",
    )
    (bindir / "apx-tool").chmod(0o755)
    env = clean_env(tmp_path, site)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"

    done = run(cli("run", "--plugins", "apx_run", "apx-tool"), tmp_path, env)

    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{bindir / 'apx-tool'} patched\n"
    assert shutil.which("apx-tool", path=env["PATH"]) == str(bindir / "apx-tool")
