"""Built-in recipes, one module each, registered through beatloop's own plugin hook.

This package shares its name with the public function ``beatloop.recipes()``: Python
binds a subpackage to its parent's attribute when it is imported, so the package itself
is made callable and returns the sorted recipe names, and both spellings keep working.
"""

import sys
import types


class _CallableRecipesPackage(types.ModuleType):
    def __call__(self) -> list[str]:
        """Sorted names of every registered recipe (the registry's, plugins included)."""
        from beatloop.plugins.registry import recipes

        return recipes()


sys.modules[__name__].__class__ = _CallableRecipesPackage
