#!/usr/bin/env python3
"""Checks dstrain's layering (docs/design.md "Layers and folders"): every #include "..." of our own
code names a file in the same layer or a lower one, and the model families never include one
another. Prints each violation (file:line, the include, both layers) and exits 1 if there is any.

  python3 scripts/check_layers.py [REPO]

The layers, lowest first. A file belongs to the layer with the longest matching path prefix.
Peers share a rank and may not include each other (the model families: a new family includes the
core, never a sibling).
"""
import os
import re
import sys

# (path prefix, rank). Same rank = may include each other, unless both are listed in PEERS.
LAYERS = [
    ("ops/", 0),
    ("config_schema/", 1),
    ("formats/", 2),
    ("data/", 3),
    ("models/", 4),                 # the core: Layer, the layer stack, the model-family interface
    ("models/gpt2/", 5),            # the families, above the core
    ("models/llama/", 5),
    ("models/model_registry.", 6),  # the registry of families: the built-in ones and --model specs
    ("zero/", 7),
    ("offload/", 8),
    ("engine/optim/", 9),
    ("engine/", 10),
    ("engine/checkpoint/", 11),     # the CheckpointManager, above the Engine it saves
    ("train/monitor/", 12),
    ("train/", 13),
    ("tools/", 14),
]
PEERS = [("models/gpt2/", "models/llama/")]
SOURCE_DIRS = ["ops", "config_schema", "formats", "data", "models", "zero", "offload", "engine", "train", "tools"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    best = None
    for prefix, rank in LAYERS:
        if path.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, rank)
    return best


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    os.chdir(repo)
    violations = []
    files = 0
    for top in SOURCE_DIRS:
        for dirpath, _, names in os.walk(top):
            for name in names:
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                files += 1
                mine = layer_of(path)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        theirs = layer_of(target)
                        if theirs is None:
                            continue  # not ours (a generated header, a relative include)
                        if theirs[1] > mine[1]:
                            violations.append(f"{path}:{lineno}: includes {target} — layer {theirs[0]} is above {mine[0]}")
                        elif theirs[1] == mine[1] and theirs[0] != mine[0] and \
                                any({mine[0], theirs[0]} == set(p) for p in PEERS):
                            violations.append(f"{path}:{lineno}: includes {target} — {mine[0]} and {theirs[0]} are peers (model "
                                              "families include the models core, never each other)")
    for v in violations:
        print(v)
    print(f"check_layers: {files} files, {len(violations)} upward or sideways include(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
