"""The topic pages' titles (catalogue texts, ``topic.title.<topic>``) and icons.

Their sentences are catalogue entries too (``text/catalogue/topics.json``): ``topic.<page>.<name>``,
where ``{name}`` marks a figure the page fills in from what it measured (lesson/topics.py)."""

from paged_kv_lab.text.i18n import Text

TOPIC_IDS = ("onehash", "blocksize", "collisions", "hitttft", "designs")
TITLES = {t: Text(f"topic.title.{t}") for t in TOPIC_IDS}
ICONS = {"onehash": "👯", "blocksize": "📏", "collisions": "🎲", "hitttft": "⏱️", "designs": "🌳"}
