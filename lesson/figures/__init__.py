"""Figure builders: pure functions Snapshot (and records) -> plotly Figure."""
from .address import Address, address_figure, address_of
from .chains import chain_nodes, hash_chains
from .charts import blocks_held, metrics_over_time, token_budget
from .common import color_map, short_hash
from .grid import block_grid
from .queue import free_queue
from .tables import block_tables, table_rows

__all__ = [
    "Address", "address_figure", "address_of", "chain_nodes", "hash_chains", "blocks_held",
    "metrics_over_time", "token_budget", "color_map", "short_hash", "block_grid", "free_queue",
    "block_tables", "table_rows",
]
