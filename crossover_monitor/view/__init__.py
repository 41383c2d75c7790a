"""What a person reads: ``once``'s report, the chart of a sweep and its SVG, ``plot``'s PNG."""
