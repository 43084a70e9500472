#!/usr/bin/env python3
"""The commit message rule, one definition for the commit-msg hook and CI.

A message is ``area: imperative summary`` on its first line, details in a body after a
blank line:

* area: lower case, e.g. ``hw``, ``gpu_ref``, ``docs``, ``bench/gpu`` (letters, digits,
  ``_ . / -``; several as ``hw, rtl_gen``), then ``": "`` and the summary;
* at most 72 characters, no trailing period, no ``WIP``;
* the summary says what the commit does (``add``, not ``added`` / ``adds``);
* with a body, the second line is blank.

Usage:
    check_subject.py FILE         check the message in FILE (the commit-msg hook; git's
                                  comment lines and everything below the scissors line
                                  are ignored, as git drops them)
    check_subject.py --since REV  check every non-merge commit of REV..HEAD (CI); fails
                                  when REV is not in this clone
    check_subject.py --message TEXT
Exit 0: all good; 1: a message breaks the rule (each problem printed); 2: bad usage.
"""

from __future__ import annotations

import re
import subprocess
import sys

MAX_SUBJECT = 72
AREA = r"[a-z0-9][a-z0-9_./-]*"
SUBJECT = re.compile(rf"(?P<area>{AREA}(?:, {AREA})*): (?P<summary>\S.*)")
#: First words that describe instead of command (the summary is imperative).
NOT_IMPERATIVE = {"added", "adds", "adding", "fixed", "fixes", "fixing", "updated", "updates",
                  "updating", "removed", "removes", "removing", "changed", "changes",
                  "changing", "moved", "moves", "moving", "renamed", "renames", "made",
                  "makes", "deleted", "deletes", "improved", "improves", "refactored",
                  "refactors", "replaced", "replaces", "implemented", "implements"}
#: Messages git writes itself for merges (the CI check skips merges).
GIT_MERGE = re.compile(r"Merge (branch|branches|remote-tracking branch|tag|commit) ")
SCISSORS = "# ------------------------ >8 ------------------------"


def clean(text: str) -> str:
    """The message as git stores it: comment lines and the part below the scissors line
    dropped, trailing spaces and leading blank lines removed."""
    lines = []
    for line in text.splitlines():
        if line.startswith(SCISSORS):
            break
        if not line.startswith("#"):
            lines.append(line.rstrip())
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines)


def problems(message: str) -> list[str]:
    """What is wrong with a commit message (empty: it follows the rule)."""
    lines = clean(message).split("\n")
    subject = lines[0]
    if not subject:
        return ["empty message"]
    if GIT_MERGE.match(subject):
        return []
    out = []
    m = SUBJECT.fullmatch(subject)
    if m is None:
        out.append("subject must be 'area: imperative summary' with a lower-case area "
                   "(e.g. 'hw: ...', 'gpu_ref: ...', 'bench/gpu: ...')")
    elif m.group("summary").split()[0].lower() in NOT_IMPERATIVE:
        out.append(f"summary must be imperative ('{m.group('summary').split()[0]}': say what "
                   "the commit does, e.g. 'add', 'fix')")
    if len(subject) > MAX_SUBJECT:
        out.append(f"subject is {len(subject)} characters, at most {MAX_SUBJECT} "
                   "(details go in the body)")
    if subject.endswith("."):
        out.append("subject ends with a period")
    if re.search(r"\bwip\b", subject, re.IGNORECASE):
        out.append("subject says WIP (commit finished work; experiments stay on branches)")
    if len(lines) > 1 and lines[1]:
        out.append("second line must be blank (subject, blank line, body)")
    return out


def check_range(since: str) -> int:
    """Check the non-merge commits of ``since``..HEAD; 0 / 1 as :func:`main`."""
    known = subprocess.run(["git", "cat-file", "-e", f"{since}^{{commit}}"],
                           capture_output=True)
    if known.returncode:
        print(f"check_subject: commit {since} is not in this clone (a shallow clone? fetch "
              f"the full history: git fetch --unshallow); cannot check the commits after it",
              file=sys.stderr)
        return 1
    log = subprocess.run(["git", "log", "--no-merges", "--format=%h%x00%B%x1e",
                          f"{since}..HEAD"], capture_output=True, text=True, check=True).stdout
    bad = n = 0
    for rec in log.split("\x1e"):
        if not rec.strip():
            continue
        sha, msg = rec.strip("\n").split("\x00", 1)
        n += 1
        errs = problems(msg)
        if errs:
            bad += 1
            print(f"{sha} {msg.splitlines()[0] if msg.strip() else ''}")
            print("".join(f"    - {e}\n" for e in errs), end="")
    print(f"check_subject: {n} commit(s) after {since}, {bad} breaking the rule")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--since":
        return check_range(argv[1])
    if len(argv) == 2 and argv[0] == "--message":
        text = argv[1]
    elif len(argv) == 1 and not argv[0].startswith("-"):
        with open(argv[0], encoding="utf-8") as f:
            text = f.read()
    else:
        print(__doc__.split("Usage:")[1].rstrip(), file=sys.stderr)
        return 2
    errs = problems(text)
    for e in errs:
        print(f"commit message: {e}", file=sys.stderr)
    if errs:
        print(f"  subject: {clean(text).split(chr(10))[0]!r}\n"
              "  rule: .githooks/check_subject.py (git commit --no-verify skips the hook; "
              "CI checks anyway)", file=sys.stderr)
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
