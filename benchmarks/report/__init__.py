"""Results report: ``benchmarks/RESULTS.md`` and a throughput chart from ``benchmarks/results/``.

    .bench-venv/bin/python -m benchmarks.report [--results DIR] [--output FILE]

One module a benchmark (``drain``, ``peers``, ``claims``...), and ``document`` that puts them
together. Reads every JSON file in ``benchmarks/results/`` (or ``--results DIR``) and writes

* ``benchmarks/RESULTS.md`` (or ``--output FILE``): the machine, then one section per
  benchmark with the command that produced its results, its figures (medians, and the spread,
  min to max, where the results keep every run) and the targets set for it, each marked met or
  not met;
* ``throughput.png`` in the results directory: drain rate against batch size, for outbox and
  the raw loop at each process count, with the peers' best rates as reference lines.

The chart needs matplotlib, which is no dependency of the project: run the report with the
benchmarks' own virtualenv (``.bench-venv``, where matplotlib is installed). Without matplotlib
RESULTS.md is still written and the chart is skipped. The report reads files only: it needs
neither PostgreSQL nor the project's dependencies.
"""
