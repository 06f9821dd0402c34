"""Write src/vitkit/assets/imagenet1k_classes.tsv: the 1000 ImageNet-1k classes in label order.

Derived from the files timm ships (timm/data/_info/imagenet_synsets.txt gives the label order,
imagenet_synset_to_lemma.txt the WordNet lemmas), never typed by hand. Each line is `synset<TAB>name`, where
the name is the first lemma ("tench, Tinca tinca" -> "tench"); the few first lemmas two classes share
("crane" the bird and the machine, ...) get their synset id appended so every name is unique.

    python tools/make_imagenet_classes.py   # needs timm installed
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "vitkit" / "assets" / "imagenet1k_classes.tsv"


def imagenet_classes() -> list[tuple[str, str]]:
    from importlib.resources import files

    info = files("timm.data") / "_info"
    synsets = (info / "imagenet_synsets.txt").read_text().split()
    lemmas = dict(line.split("\t", 1) for line in (info / "imagenet_synset_to_lemma.txt").read_text().splitlines()
                  if "\t" in line)
    first = [lemmas[s].split(",")[0].strip() for s in synsets]
    shared = {n for n, c in Counter(first).items() if c > 1}
    names = [f"{n} ({s})" if n in shared else n for n, s in zip(first, synsets)]
    assert len(synsets) == 1000 and len(set(names)) == 1000
    return list(zip(synsets, names))


def main() -> None:
    rows = imagenet_classes()
    OUT.write_text("".join(f"{s}\t{n}\n" for s, n in rows))
    print(f"wrote {OUT} ({len(rows)} classes)")


if __name__ == "__main__":
    main()
