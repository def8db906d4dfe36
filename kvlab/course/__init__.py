"""The course layer: builds the course and its report, the ``kvlab`` command, lab definitions, exercises, results and
lab grids (local and on Ray)."""
