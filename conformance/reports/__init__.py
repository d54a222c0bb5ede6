"""What a run says: the terminal's progress and summary, the report files (``report.json``,
``junit.xml``, ``report.md``), reports compared, and the catalogue's coverage table."""
