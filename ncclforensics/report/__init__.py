"""The HTML incident report (DESIGN.md §5): view-model, plotly charts, one autoescaped jinja page."""
