"""The one place that sets up matplotlib for the package's PNG plots."""

from keras_posenc.files import atomic_path


def pyplot():
    """`matplotlib.pyplot` on the non-interactive Agg backend (imported lazily: plotting is optional)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi=100):
    """Lays out, writes (atomically: `files.atomic_path`) and closes `fig`; returns `path`."""
    try:
        fig.tight_layout()
        with atomic_path(path) as temp:
            fig.savefig(temp, dpi=dpi)
    finally:
        pyplot().close(fig)
    return path
