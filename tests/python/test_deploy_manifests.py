"""The Kubernetes manifests under deploy/ only use flags the binary has: each
`--flag` in a container's args must appear in `vela <command> --help`."""

import os
import re
import subprocess

from velaproc import ROOT, vela_binary

MANIFESTS = os.path.join(ROOT, "deploy", "k8s")


def container_args(path):
    """(command, [flags]) of the vela container in a manifest."""
    command, flags, in_args = None, [], False
    for line in open(path):
        stripped = line.strip()
        if stripped == "args:":
            in_args = True
            continue
        if in_args:
            m = re.match(r"- (\S+)", stripped)
            if not m or stripped.startswith("#"):
                if not stripped.startswith("#"):
                    in_args = False
                continue
            word = m.group(1)
            if word.startswith("--"):
                flags.append(word.split("=", 1)[0])
            elif command is None:
                command = word
    return command, flags


def test_manifest_flags_exist():
    checked = 0
    for name in sorted(os.listdir(MANIFESTS)):
        command, flags = container_args(os.path.join(MANIFESTS, name))
        if command is None:
            continue
        help_text = subprocess.run(
            [vela_binary(), command, "--help"], capture_output=True, text=True, check=True
        ).stdout
        for flag in flags:
            assert flag in help_text, "%s: vela %s has no %s" % (name, command, flag)
            checked += 1
    assert checked >= 10, "expected the bookie and broker manifests to be checked"
