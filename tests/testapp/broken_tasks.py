"""A module of tasks that fails to import, as on a worker missing a dependency."""

import a_dependency_that_is_not_installed  # noqa: F401
