"""``python -m paged_kv_lab pack``: the class pack, one folder of offline players
(ui/class_pack.py).

    python -m paged_kv_lab pack --out DIR [--lessons all|ID,ID,...] [--lang en,zh]
                          [--model M] [--device D]

The arguments are checked before the model loads: unknown ids or languages are refused with the
valid ones, and the folder must be new or empty. Exit codes: 0 ok, 2 refused arguments, 3 model or
device unavailable.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from paged_kv_lab.run.scenario import DEVICES, MODELS
from paged_kv_lab.text.i18n import languages, said, tr


def add_parser(sub) -> None:
    p = sub.add_parser("pack", help=tr("cli.pack.help"))
    p.add_argument("--out", required=True, metavar="DIR", help=tr("cli.pack.out"))
    p.add_argument("--lessons", default="all", metavar="all|ID,ID,...", help=tr("cli.pack.lessons"))
    p.add_argument("--lang", metavar="en,zh", help=tr("cli.pack.lang"))
    p.add_argument("--model", choices=MODELS, default="smollm2", help=tr("cli.pack.model"))
    p.add_argument("--device", choices=DEVICES, default="auto", help=tr("cli.pack.device"))


def _say_lang(args: argparse.Namespace) -> str:
    """The language of the command's own messages: the pack's first, if it is one."""
    first = (args.lang or "").split(",")[0].strip()
    return first if first in languages() else next(iter(languages()))


def cmd_pack(args: argparse.Namespace) -> int:
    from paged_kv_lab.classroom.pack_site import PackRefused, check_out_dir, write_pack
    from paged_kv_lab.ui.class_pack import build_pack, select_items, select_langs

    lang = _say_lang(args)
    try:
        items = select_items(args.lessons)
        langs = select_langs(args.lang)
        out = check_out_dir(args.out)
    except PackRefused as e:
        print(tr("cli.error", lang, message=said(e, lang)), file=sys.stderr)
        return 2
    from kvcore.model import DeviceNotAvailable, ModelNotAvailable, load_model
    from paged_kv_lab.ui.modelstate import ModelState

    t0 = time.perf_counter()
    try:
        model = load_model(args.model, args.device)
    except (ModelNotAvailable, DeviceNotAvailable) as e:
        print(tr("cli.error", lang, message=str(e)), file=sys.stderr)
        return 3
    ms = ModelState(args.model, args.device, model, None, time.perf_counter() - t0)

    def progress(n: int, total: int, stem: str) -> None:
        print(tr("cli.pack.progress", lang, n=n, total=total, id=stem), file=sys.stderr)

    # nobody else waits for this process's store: its steps need not wait behind clicks
    files = build_pack(items, langs, ms, progress=progress, background=False)
    try:
        size = write_pack(out, files)
    except PackRefused as e:  # the folder filled up while the runs were recorded
        print(tr("cli.error", lang, message=said(e, lang)), file=sys.stderr)
        return 2
    print(
        tr(
            "cli.pack.done",
            lang,
            files=len(files),
            size=f"{size / 1e6:.1f}",
            path=str(out),
            seconds=f"{time.perf_counter() - t0:.0f}",
            index=str(Path(out) / "index.html"),
        )
    )
    return 0
