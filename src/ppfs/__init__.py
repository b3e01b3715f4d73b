"""ppfs: privacy-preserving feature selection (MS-GINI) and training on secret-shared data."""

__version__ = "0.1.0"
