"""python -m bench.synth report|mantissa|keyfold [options]

  report    the synthesis plot (bench/results/synth_area.png) and the ``synth`` block of
            docs/HARDWARE.md from bench/results/synth.json (``make synth``) and synth_mantissa.json
  mantissa  K/V error vs the BFP mantissa width on the real-K/V fixture
            (bench/results/synth_mantissa.json and .png)
  keyfold   area of the key front end folded into the front end against the front end
            (synth_ecp5 of the components and the encoders alone; printed, no record)

``python -m bench.synth COMMAND --help`` lists each command's options.
"""

from __future__ import annotations

import sys

COMMANDS = ("report", "mantissa", "keyfold")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"error: command {cmd!r}: one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if cmd == "report":
        from bench.synth.report import main as run
    elif cmd == "keyfold":
        from bench.synth.keyfold import main as run
    else:
        from bench.synth.mantissa import main as run
    return run(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
