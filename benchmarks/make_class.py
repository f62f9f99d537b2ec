"""Make a class's worth of submissions for timing batch grading:

    python benchmarks/make_class.py /tmp/class --count 100
    time moco-ref grade /tmp/class -j 2 --out /tmp/class-reports --force

Cycles through the example submissions (correct variants and known-buggy ones, every style),
giving each copy its own folder (``student-007/``) and a distinct first line, so no two files
have the same content (the cache cannot help) and every report file has its own name.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "submissions"


def make_class(folder: Path, count: int) -> list[Path]:
    sources = sorted(path for path in EXAMPLES.iterdir()
                     if path.suffix in (".py", ".ipynb") and not path.name.startswith("_"))
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for index in range(count):
        source = sources[index % len(sources)]
        student = folder / f"student-{index:03d}"
        student.mkdir(exist_ok=True)
        target = student / source.name
        text = source.read_text(encoding="utf-8")
        if source.suffix == ".ipynb":
            notebook = json.loads(text)
            notebook["cells"].insert(0, {"cell_type": "markdown", "metadata": {},
                                         "source": [f"student {index}"]})
            text = json.dumps(notebook, indent=1)
        else:
            text = f"# student {index}\n{text}"
        target.write_text(text, encoding="utf-8")
        made.append(target)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    made = make_class(args.folder, args.count)
    print(f"{len(made)} submissions in {args.folder}")


if __name__ == "__main__":
    main()
