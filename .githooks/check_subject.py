#!/usr/bin/env python3
"""The commit message rule, one definition for the commit-msg hook and CI.

A message is ``area: imperative summary`` on its first line, details in a body after a
blank line:

* area: any lower-case word (letters, digits, ``_ . / -``; several as ``hw, rtl_gen``),
  then ``": "`` and the summary; the common areas: sim_models, hw, rtl_gen, verif,
  gpu_ref, kvtest, bench, tests, docs, build (for the Makefile, pyproject.toml, hooks);
* at most 72 characters, no trailing period, no ``WIP`` word;
* the summary says what the commit does (``add``, not ``added`` / ``adds``);
* with a body, the second line is blank.

``fixup! ...`` / ``squash! ...`` / ``amend! ...`` subjects (``git commit --fixup``, squashed
by ``git rebase -i --autosquash``) pass the commit-msg hook, so a branch can collect them;
the range check (CI) rejects them: the history that is merged holds none.

Usage:
    check_subject.py FILE         check the message in FILE (the commit-msg hook; git's
                                  comment lines and everything below the scissors line
                                  are ignored, as git drops them)
    check_subject.py --since REV  check every non-merge commit of REV..HEAD (CI)
    check_subject.py --message TEXT
Exit 0: all good; 1: a message breaks the rule (each problem printed); 2: bad usage (an
unreadable FILE, a REV this clone does not know).
"""

from __future__ import annotations

import os
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
#: Subjects of commits made to be squashed into an earlier one (git commit --fixup / --squash).
AUTOSQUASH = re.compile(r"(fixup|squash|amend)! ")
#: WIP as a word of its own ("WIP", "wip:", "(wip)"), not inside one ("wip-state", "wiped").
WIP = re.compile(r"(?<![\w-])wip(?![\w-])", re.IGNORECASE)


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


def problems(message: str, autosquash: bool = False) -> list[str]:
    """What is wrong with a commit message (empty: it follows the rule).

    ``autosquash``: accept ``fixup!`` / ``squash!`` / ``amend!`` subjects (the commit-msg
    hook: they are squashed before merging); without it (the range check) they are an
    error."""
    lines = clean(message).split("\n")
    subject = lines[0]
    if not subject:
        return ["empty message"]
    if GIT_MERGE.match(subject):
        return []
    if AUTOSQUASH.match(subject):
        if autosquash:
            return []
        return [f"'{subject.split('!')[0]}!' commit: squash it into its target before merging "
                "(git rebase -i --autosquash)"]
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
    if WIP.search(subject):
        out.append("subject says WIP (commit finished work; experiments stay on branches)")
    if len(lines) > 1 and lines[1]:
        out.append("second line must be blank (subject, blank line, body)")
    return out


def check_range(since: str) -> int:
    """Check the non-merge commits of ``since``..HEAD; 0 / 1 as :func:`main`."""
    known = subprocess.run(["git", "cat-file", "-e", f"{since}^{{commit}}"],
                           capture_output=True)
    if known.returncode:
        shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"],
                                 capture_output=True, text=True).stdout.strip() == "true"
        hint = ("; this clone is shallow: fetch the full history (git fetch --unshallow)"
                if shallow else "")
        print(f"check_subject: --since {since}: unknown revision{hint}; cannot check the "
              "commits after it", file=sys.stderr)
        return 2
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
    elif len(argv) == 1 and argv[0] in ("-h", "--help"):
        try:
            print(__doc__.strip(), flush=True)
        except BrokenPipeError:   # `--help | head`: Python's flush at exit must not fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    elif len(argv) == 1 and not argv[0].startswith("-"):
        try:
            with open(argv[0], encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as err:
            print(f"check_subject: cannot read the message file {argv[0]}: "
                  f"{getattr(err, 'strerror', None) or err}", file=sys.stderr)
            return 2
    else:
        print("usage:" + __doc__.split("Usage:")[1].rstrip(), file=sys.stderr)
        return 2
    errs = problems(text, autosquash=True)
    for e in errs:
        print(f"commit message: {e}", file=sys.stderr)
    if errs:
        print(f"  subject: {clean(text).split(chr(10))[0]!r}\n"
              "  rule: .githooks/check_subject.py (git commit --no-verify skips the hook; "
              "CI checks anyway)", file=sys.stderr)
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
