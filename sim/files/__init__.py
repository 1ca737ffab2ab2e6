"""Files in and out: written whole or not at all (``atomic``), YAML read with one-line errors
(``yamlfile``), names and text shown safely whatever their bytes (``text``)."""
