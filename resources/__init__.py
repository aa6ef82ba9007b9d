"""Dagster resources of tkg. Import as `from resources.tkg import ...`; the package name is generic,
so nothing else in this repository may be called `resources`."""
