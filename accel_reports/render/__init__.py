"""The last stage of a report: the analysed report out as files.

``report`` writes ``report.html`` (self-contained, from ``templates/``) and ``report.md``
(``write_report``, ``render_html``, ``render_markdown``) from the views: ``tests_view`` (matrix, grid,
failures, diff, title, verdict, areas), ``bench_view``, ``ops_view``, ``evidence_view``, ``env_view``,
``models_view``, ``compile_view``, with ``text`` (escaping and numbers), ``charts`` and ``loss_curves``
(inline SVG); ``support_matrix`` writes the support matrix beside it. Imports the load and analyse
stages, never the history (a report built from a history gets its rows handed in).
"""
