"""The "Files" section of ``fedshift data check``: per site, the images' sizes on disk before
resizing, and what the loader found but did not use (files that are not images, images
beside the class folders, unreadable images skipped with ``dataset.skip_unreadable``).

Original sizes are read for the loaders of class folders (``folders``, ``pacs``,
``officehome``: :func:`fedshift.data.domains.class_folders.original_sizes`, file headers
only); other datasets are decoded from arrays or volumes and say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedshift.core.federation import Federation
from fedshift.data.domains.class_folders import original_sizes

__all__ = ["files_meta", "render_files"]

#: fed.info keys naming each client's folder of class folders, by loader
FOLDER_KEYS = ("site_folders", "domain_folders")
#: datasets whose site folders hold class folders (segfolders' hold images/ and masks/)
CLASS_FOLDER_DATASETS = ("folders", "pacs", "officehome")


def files_meta(fed: Federation) -> dict[str, Any]:
    """``{"resized": "CxHxW", "sites": {site: {...}}}``: per site ``original`` (see
    :func:`~fedshift.data.domains.class_folders.original_sizes`, or None where the dataset
    has no image files of its own) and the counts of ``not_images``, ``stray_images`` and
    ``unreadable`` files the loader skipped."""
    info = fed.info
    folders: dict[str, str] = {}
    if fed.name in CLASS_FOLDER_DATASETS:
        for key in FOLDER_KEYS:
            folders.update(info.get(key) or {})
    skipped = info.get("skipped") or {}
    sites: dict[str, dict[str, Any]] = {}
    for c in fed.client_names:
        folder = folders.get(c)
        sites[c] = {
            "original": original_sizes(Path(folder)) if folder else None,
            **{k: len((skipped.get(k) or {}).get(c, [])) for k in
               ("not_images", "stray_images", "unreadable")},
        }  # fmt: skip
    c, h, w = fed.input_shape
    return {"resized": f"{c}x{h}x{w}", "sites": sites}


def render_files(meta: dict[str, Any]) -> list[str]:
    """The report's "Files" section (Markdown lines)."""
    sites = meta["sites"]
    lines = [
        "## Files",
        "",
        f"Image sizes on disk before every image is resized to {meta['resized']} (width x "
        "height, by pixel count), and the files the loader skipped.",
        "",
        "| site | images | smallest | median | largest | sizes | not images | beside the "
        "class folders | unreadable (skipped) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, s in sites.items():
        o = s["original"]
        sizes = (
            [str(o["images"]), str(o["min"]), str(o["median"]), str(o["max"]), str(o["sizes"])]
            if o else ["-", "not read for this dataset", "-", "-", "-"]
        )  # fmt: skip
        row = [name, *sizes, str(s["not_images"]), str(s["stray_images"]), str(s["unreadable"])]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    stray = sum(s["stray_images"] for s in sites.values())
    if stray:
        lines += [
            f"{stray} image(s) lie directly in a site folder, beside its class folders: they "
            "belong to no class and are not used; move each into its class folder "
            "(<dataset.root>/<site>/<class>/<image>) or out of the site folder.",
            "",
        ]
    return lines
