"""An archive tool of results/ (a script without .py, e.g. results/plot) imported as a module, so
that a test can call its functions and look at what they return (figure objects, tables)."""
import importlib.machinery
import importlib.util
import os


def import_tool(results, name):
    """results/NAME as the module tool_NAME."""
    loader = importlib.machinery.SourceFileLoader("tool_" + name, os.path.join(results, name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
