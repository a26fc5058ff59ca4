"""Helpers the tests share that are not fixtures (fixtures live in the conftest.py files).

Tests import them as ``support.<module>`` (pytest puts tests/ on sys.path: the root conftest.py
sits there and no folder of the suite is a package). A test module never imports another test
module (tests/project/test_layout_of_tests.py checks it): what two modules share lives here.

- ``paths``: the repository's folders (no test computes a path from its own ``__file__``);
- ``models``: transformers' greedy reference and the engine runs the model tests compare with it;
- ``kv``: builders of kvcore objects and engines without a model, and ``ask_vllm``;
- ``app``: driving a page with AppTest (``Browser`` keeps what the page streamed to the player);
- ``browser``: a real ``streamlit run`` server and chromium helpers (the fixtures are in
  tests/browser/conftest.py);
- ``cli``, ``event_runs``, ``kv_events``, ``kv_pub``, ``runner_tap``, ``scenario_cases``,
  ``casebook_claims``, ``lesson_files``, ``pseudo``, ``words``, ``lookahead_driver``: one
  subject each (see each module's docstring);
- ``reference/``: scripts run by the reference environments' own Python (vLLM 0.34.0, SGLang),
  by path, never imported here.
"""
