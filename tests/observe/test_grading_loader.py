"""Getting submissions in: .py files, notebooks (definitions only, or every cell), module
paths and folders; and the worker's record for what cannot be loaded. All in-process."""

from __future__ import annotations

import ast
import sys
import textwrap

import nbformat
import numpy as np
import pytest
import torch

from moco_ref.observe.loader import (
    SUBMISSION_MODULE_NAME,
    DefinitionFilter,
    load_submission,
    strip_ipython,
)
from moco_ref.observe.worker import observe_submission
from moco_ref.probe.options import GradeOptions
from moco_ref.run.targets import TargetError, expand_targets
from tests.helpers.grading_stubs.fixtures import GOOD_WARMUP, stubbed, write  # noqa: F401 - fixture


@pytest.fixture(autouse=True)
def _forget_submission_module():
    yield
    sys.modules.pop(SUBMISSION_MODULE_NAME, None)


def _notebook(path, *cells) -> str:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell(source[3:]) if source.startswith("md:")
        else nbformat.v4.new_code_cell(textwrap.dedent(source))
        for source in cells
    ]
    nbformat.write(notebook, str(path))
    return str(path)


def _student_notebook(tmp_path):
    sentinel = tmp_path / "training-ran.txt"
    path = _notebook(
        tmp_path / "student.ipynb",
        "md:# LAB 07",
        "%matplotlib inline\n!pip install tqdm\nimport torch\nimport numpy as np\nfiles = !ls",
        textwrap.dedent("""
        SEED = 0
        CAPACITY = 4 * 60
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            import google.colab
            IN_COLAB = True
        except ImportError:
            IN_COLAB = False
        """)
        + GOOD_WARMUP,
        f"""
        history = moco_warmup()
        open({str(sentinel)!r}, "w").write("trained")
        if __name__ == "__main__":
            print("main")
        """,
        "%%time\nopen('should-not-run.txt', 'w')",
    )
    return path, sentinel


# --------------------------------------------------------------------------- files


def test_python_file_runs_as_a_module_not_as_main(tmp_path):
    path = write(tmp_path, "sub.py", GOOD_WARMUP + textwrap.dedent("""
        from dataclasses import dataclass

        @dataclass
        class Config:
            m: float = 0.99

        if __name__ == "__main__":
            raise SystemExit("must not run while grading")
    """))
    loaded = load_submission(path)
    assert loaded.kind == "python file"
    assert loaded.namespace["moco_warmup"]()["FIFO"] == ["c", "d", "e", "f"]
    assert loaded.namespace["Config"]().m == 0.99  # dataclasses need the registered module
    assert loaded.notes == []


def test_notebook_keeps_definitions_and_reports_what_it_skipped(tmp_path):
    path, sentinel = _student_notebook(tmp_path)
    loaded = load_submission(path)
    namespace = loaded.namespace
    assert loaded.kind == "notebook"
    assert namespace["SEED"] == 0 and namespace["CAPACITY"] == 240
    assert namespace["device"] == torch.device("cpu") and namespace["IN_COLAB"] is False
    assert namespace["np"] is np and callable(namespace["moco_warmup"])
    assert "history" not in namespace and not sentinel.exists()
    notes = "\n".join(loaded.notes)
    assert "cell 2: skipped IPython magic/shell `%matplotlib inline`, `!pip install tqdm`" in notes
    assert "files = !ls" in notes
    assert "cell 4: skipped top-level work `history = moco_warmup()` (line 2)" in notes
    assert "`if __name__ == \"__main__\":" in notes
    assert "cell 5: ran the body of `%%time` as IPython does" in notes
    assert "cell 5: skipped top-level work `open(" in notes


def test_notebook_execute_all_cells_runs_the_top_level_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, sentinel = _student_notebook(tmp_path)
    loaded = load_submission(path, execute_all_cells=True)
    assert loaded.namespace["history"]["EMA"] == [0.2, 2.2]
    assert sentinel.read_text() == "trained"
    assert (tmp_path / "should-not-run.txt").exists()  # %%time runs its body, as IPython does
    assert "executed all 4 code cells (--execute-all-cells)" in loaded.notes


def test_notebook_errors_name_the_cell_and_show_its_line(tmp_path):
    broken = _notebook(tmp_path / "broken.ipynb", "import torch", "def f(:\n    pass")
    with pytest.raises(SyntaxError) as caught:
        load_submission(broken)
    assert caught.value.filename.endswith("broken.ipynb#cell2")

    raising = _notebook(tmp_path / "raising.ipynb", "def boom():\n    raise ValueError('x')")
    loaded = load_submission(raising)
    with pytest.raises(ValueError) as caught:
        loaded.namespace["boom"]()
    assert "raise ValueError('x')" in "".join(
        __import__("traceback").format_tb(caught.value.__traceback__)
    )


def test_module_path_is_imported(tmp_path, monkeypatch):
    package = tmp_path / "student_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "moco_impl.py").write_text(GOOD_WARMUP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    loaded = load_submission("student_pkg.moco_impl")
    assert loaded.kind == "module" and "moco_warmup" in loaded.namespace
    assert expand_targets(["student_pkg.moco_impl"]) == ["student_pkg.moco_impl"]
    sys.modules.pop("student_pkg.moco_impl", None)
    sys.modules.pop("student_pkg", None)


# --------------------------------------------------------------------------- targets


def test_folders_expand_to_their_submissions_sorted(tmp_path):
    for name in ("b.ipynb", "a.py", "__init__.py", "_helpers.py", ".hidden.py", "conftest.py",
                 "manifest.json", "notes.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "other").mkdir()
    single = write(tmp_path / "other", "z.py", "")
    assert expand_targets([tmp_path, single]) == [
        str(tmp_path / "a.py"), str(tmp_path / "b.ipynb"), single
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.py", "no such file, folder or importable module"),
        (lambda p: p, "no submissions"),
        (lambda p: (p / "notes.txt").write_text("") or p / "notes.txt", "neither a .py"),
        (lambda p: "surely_no_such_module_xyz.impl", "no such file, folder or importable"),
    ],
)
def test_bad_targets_are_usage_errors(tmp_path, make, message):
    with pytest.raises(TargetError, match=message):
        expand_targets([make(tmp_path)])


# --------------------------------------------------------------------------- filters


@pytest.mark.parametrize(
    ("statement", "kept"),
    [
        ("import torch.nn.functional as F", True),
        ("from torch import nn", True),
        ("def f(x):\n    return train(x)", True),
        ("class Net(nn.Module):\n    pass", True),
        ("'''a docstring'''", True),
        ("LR = 2e-3", True),
        ("SIZES = (60, 240, -1 * 3)", True),
        ("NAME = f'run-{LR}'", True),
        ("CONFIG = {'lr': LR, 'dims': [24, 2]}", True),
        ("DTYPE = torch.float32", True),
        ("DEVICE = th.device('cpu')", True),  # alias resolved: th is torch
        ("act = lambda x: x", True),
        ("x = torch.randn(3)", False),
        ("model = Net()", False),
        ("print('hi')", False),
        ("for i in range(3):\n    pass", False),
        ("torch.manual_seed(0)", False),
        ("if __name__ == '__main__':\n    pass", False),
        ("with open('f') as f:\n    pass", False),
        ("results = train_moco(initial, x, train)", False),
        ("obj.attr = 3", False),
        # values of imported libraries computed from constants are constants too
        ("EPS = torch.finfo(torch.float32).eps", True),
        ("LOW = th.finfo(th.float16).min", True),
        ("SCALE = math.sqrt(24) * math.log(2)", True),
        ("START = np.zeros(3)", True),
        ("TABLE = np.loadtxt('settings.csv')", False),  # I/O, not a value
        ("SIZE = settings('capacity')", False),  # the notebook's own code: work
        ("BIG = torch.randn(10)", False),
    ],
)
def test_definition_filter(statement, kept):
    definitions = DefinitionFilter()
    context = ("import math\nimport numpy as np\nimport torch\nimport torch as th\n"
               "from torch import nn\nLR = 1\ndef settings(name):\n    return 240")
    definitions.split(ast.parse(context).body)
    kept_nodes, skipped = definitions.split(ast.parse(statement).body)
    assert bool(kept_nodes) is kept and bool(skipped) is not kept


def test_a_skipped_statement_s_names_are_remembered_with_their_line(tmp_path):
    path = _notebook(tmp_path / "nb.ipynb", "import torch",
                     "def settings(name):\n    return 240\n\nCAPACITY = settings('k')\n"
                     "for STEP in range(2):\n    pass")
    loaded = load_submission(path)
    assert "CAPACITY" not in loaded.namespace
    assert loaded.skipped == {"CAPACITY": "cell 2: `CAPACITY = settings('k')` (line 4)",
                              "STEP": "cell 2: `for STEP in range(2):` (line 5)"}


def test_a_name_error_for_a_skipped_name_says_which_line_and_what_to_do():
    from moco_ref.judge.results import CheckResult, Status
    from moco_ref.run.pipeline import _with_skipped_line

    result = CheckResult("I3-fifo-keeps-newest", "t", "I3", 1.0, Status.ERROR,
                         "train_moco raised:\nNameError: name 'CAPACITY' is not defined")
    skipped = {"CAPACITY": "cell 2: `CAPACITY = settings('k')` (line 4)"}
    hinted = _with_skipped_line(result, skipped).message
    assert "CAPACITY is assigned in cell 2: `CAPACITY = settings('k')` (line 4)" in hinted
    assert "--execute-all-cells" in hinted
    assert _with_skipped_line(result, {}).message == result.message  # not skipped: as it was
    assert _with_skipped_line(result, "forged").message == result.message


def test_strip_ipython_keeps_blocks_and_plain_python():
    source, removed = strip_ipython("if True:\n    !echo hi\n    %time x = 1\ny = 2")
    assert removed == ["!echo hi", "%time x = 1"]
    assert source == "if True:\n    pass\n    pass\ny = 2"
    ast.parse(source)
    plain = "text = '''\n%d items\n'''"
    assert strip_ipython(plain) == (plain, [])


# --------------------------------------------------------------------------- worker records


@pytest.mark.usefixtures("stubbed")
@pytest.mark.parametrize(
    ("source", "stage", "expected"),
    [
        ("def moco_warmup(:\n    pass", "load", "SyntaxError"),
        ("import surely_no_such_module_xyz", "load", "No module named 'surely_no_such_module_xyz'"),
        ("import sys\nsys.exit('bye from the submission')", "load", "SystemExit: bye from"),
        ("raise KeyboardInterrupt", "load", "KeyboardInterrupt"),
        ("X = 1", "detect", "no MoCo names found"),
    ],
)
def test_worker_turns_failures_into_not_gradable_records(tmp_path, source, stage, expected):
    frames = observe_submission(write(tmp_path, "sub.py", source), GradeOptions())
    record = frames["result"]
    assert frames["stage"] is None and frames["parts"] == {}
    assert record["gradable"] is False and record["stage"] == stage
    assert expected in record["traceback"]
    assert "moco_ref/observe/loader.py" not in record["traceback"]  # only the submission's side


@pytest.mark.usefixtures("stubbed")
def test_worker_record_holds_plain_observations(tmp_path):
    frames = observe_submission(write(tmp_path, "sub.py", GOOD_WARMUP), GradeOptions(seed=7))
    assert frames["result"]["gradable"] and frames["result"]["style"] == "lab"
    assert frames["stage"]["parts"] == ["moco_warmup", "train_moco"]
    warmup, training = frames["parts"]["moco_warmup"], frames["parts"]["train_moco"]
    assert warmup["data"]["result"]["FIFO"] == ["c", "d", "e", "f"]
    assert warmup["meta"]["probe"]["seed"] == 7  # the record's shared entries travel along
    assert training["data"] == {"defined": False, "error": "not observed by the stand-in"}


# --------------------------------------------------------------------------- what students hand in


def _correct_source() -> str:
    from tests.helpers.conformance_support import SUBMISSIONS

    return (SUBMISSIONS / "correct_lab_order.py").read_text()


def test_a_byte_order_mark_and_a_coding_line_are_read_as_python_reads_them(tmp_path):
    bom = tmp_path / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbf" + _correct_source().encode())
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"# -*- coding: latin-1 -*-\nCAFE = '\xe9'\n" + _correct_source().encode())
    assert callable(load_submission(str(bom)).namespace["train_moco"])
    assert load_submission(str(latin)).namespace["CAFE"] == "\u00e9"


def test_a_notebook_export_s_get_ipython_calls_are_skipped_and_noted(tmp_path):
    source = ("get_ipython().system('pip install torch')\n"
              "files = get_ipython().getoutput('ls')\n"
              "if True:\n    get_ipython().run_line_magic('matplotlib', 'inline')\n"
              "X = 3\n")
    loaded = load_submission(write(tmp_path, "export.py", source))
    assert loaded.namespace["X"] == 3 and "files" not in loaded.namespace
    assert len(loaded.notes) == 1 and "pip install torch" in loaded.notes[0]


@pytest.mark.parametrize(("name", "content", "says"), [
    ("empty.py", b"  \n", "empty.py is empty"),
    ("bad.py", b"x = '\xff\xfe'\n", "bad.py cannot be decoded as Python source"),
    ("broken.ipynb", b'{"cells": [', "broken.ipynb is not a readable notebook"),
    ("noentry.py", b"x = 1\n", "no MoCo entry point found"),
])
def test_a_file_that_is_no_submission_is_one_sentence(tmp_path, name, content, says):
    path = tmp_path / name
    path.write_bytes(content)
    record = observe_submission(str(path), GradeOptions())["result"]
    assert record["gradable"] is False
    assert record["traceback"].startswith(says)
    assert "Traceback" not in record["traceback"] and "moco_ref" not in record["traceback"]


def test_a_syntax_error_in_a_cell_that_defines_nothing_keeps_the_notebook_gradable(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("X = 2"),
                      nbformat.v4.new_code_cell("for i in range(3)\n    print(i)")]
    path = tmp_path / "nb.ipynb"
    nbformat.write(notebook, str(path))
    loaded = load_submission(str(path))
    assert loaded.namespace["X"] == 2
    assert any("cell 2: skipped, it does not parse" in note for note in loaded.notes)
    notebook.cells.append(nbformat.v4.new_code_cell("def train_moco(:\n    pass"))
    nbformat.write(notebook, str(path))
    with pytest.raises(SyntaxError):  # a definition's syntax error is the student's to fix
        load_submission(str(path))


def _notebook_of(tmp_path, cells: list[str]):
    import nbformat

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    path = tmp_path / "magics.ipynb"
    nbformat.write(notebook, str(path))
    return path


def test_cell_magics_mean_what_ipython_makes_of_them(tmp_path, monkeypatch):
    """``%%time``/``%%capture`` run their body in the notebook's namespace (a class defined
    there exists); ``%%writefile`` writes its file, which a later cell imports;
    ``%%timeit`` keeps nothing it defines and ``%%bash`` is not Python: each is named in the
    notes, and a name only they would have defined points at their cell."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = _notebook_of(tmp_path, [
        "%%time\nclass Queue:\n    size = 3",
        "%%capture captured --no-stderr\ndef helper():\n    return 7",
        "%%writefile magic_helper.py\nVALUE = 11",
        "import magic_helper",
        "%%timeit\ndef lost():\n    return 1",
        "%%bash\necho hi > bash-ran.txt",
    ])
    loaded = load_submission(path)
    namespace = loaded.namespace
    assert namespace["Queue"].size == 3 and namespace["helper"]() == 7
    assert namespace["magic_helper"].VALUE == 11
    assert "lost" not in namespace and not (tmp_path / "bash-ran.txt").exists()
    notes = "\n".join(loaded.notes)
    assert "cell 1: ran the body of `%%time` as IPython does" in notes
    assert "cell 3: `%%writefile magic_helper.py` wrote magic_helper.py" in notes
    assert "cell 5: `%%timeit` runs its body in a namespace of its own" in notes
    assert "cell 6: `%%bash` is not Python, so the cell was not run" in notes
    assert loaded.skipped["lost"].startswith("cell 5: `%%timeit`")


def test_writefile_stays_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _notebook_of(tmp_path, ["%%writefile ../outside.py\nX = 1"])
    loaded = load_submission(path)
    assert not (tmp_path.parent / "outside.py").exists()
    assert "was not honoured (only a plain file name" in "\n".join(loaded.notes)


def test_a_notebook_export_runs_the_body_of_a_time_cell(tmp_path):
    """The ``.py`` a notebook exports to: ``run_cell_magic('time', …)`` runs its body."""
    path = tmp_path / "exported.py"
    path.write_text(
        "get_ipython().run_cell_magic('time', '', 'class Encoder:\\n    width = 5\\n')\n"
        "get_ipython().run_cell_magic('bash', '', 'echo hi\\n')\n")
    loaded = load_submission(path)
    assert loaded.namespace["Encoder"].width == 5
    notes = "\n".join(loaded.notes)
    assert "ran the bodies of IPython cell magics" in notes and "run_cell_magic('bash'" in notes
