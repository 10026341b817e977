"""The one place that sets up matplotlib for the package's PNG plots."""


def pyplot():
    """`matplotlib.pyplot` on the non-interactive Agg backend (imported lazily: plotting is optional)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi=100):
    """Lays out, writes and closes `fig`; returns `path`."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
