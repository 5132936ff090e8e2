"""Sphinx configuration of the foam_jax documentation (built offline)."""

import logging

import foam_jax

project = "foam_jax"
author = "the foam_jax authors"
release = foam_jax.__version__
version = release

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "sphinx.ext.napoleon",
]
autosummary_generate = True
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3
nb_execution_mode = "force"  # Every build runs the pages that run code.
nb_execution_timeout = 300
nb_execution_raise_on_error = True
exclude_patterns = ["_build", "jupyter_execute"]
html_theme = "alabaster"
html_title = f"foam_jax {release}"


# The guides link to the repository's files outside docs/ (benchmark reports,
# the example's README), which read well on the repository and are no pages
# of the site: those links are left as text. Any other missing target is an
# error.
_OUTSIDE_DOCS = ("/benchmarks/", "/examples/", "../../benchmarks/", "../../examples/")


class _LinksOutsideDocs(logging.Filter):
  """Drops MyST's missing-target warnings for links outside docs/ only."""

  def filter(self, record):
    kind = (getattr(record, "type", None), getattr(record, "subtype", None))
    if kind != ("myst", "xref_missing"):
      return True
    return not any(part in record.getMessage() for part in _OUTSIDE_DOCS)


def setup(app):
  del app
  logging.getLogger("sphinx").addFilter(_LinksOutsideDocs())
