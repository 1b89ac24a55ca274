"""What the storage tests share: the names under a store folder, read as a user would."""

from __future__ import annotations


def listed(url: str) -> list[str]:
    """The sorted names directly under the store folder `url`, as the store has them now."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()  # other processes wrote there
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
