"""Prints, or writes into docs/runtime.md, the table of every config key from the dataclasses.

    python scripts/config_keys.py            # print the table
    python scripts/config_keys.py --write    # regenerate it in docs/runtime.md

The table lists each key with its default and what it sets, taken from the ``Attributes:``
entry of its section's docstring (rljax.config.keys); tests/test_config.py fails when
docs/runtime.md's copy differs from what this writes.
"""

from __future__ import annotations

import argparse
import pathlib

from rljax.config import keys

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "runtime.md"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"regenerate the table in {DOC}")
    args = parser.parse_args()
    if not args.write:
        print(keys.markdown())
        return
    DOC.write_text(keys.with_table(DOC.read_text()))
    print(f"wrote the config key table into {DOC}")


if __name__ == "__main__":
    main()
