"""The CPU demo (``examples.demo``) and the examples from the Agent Lightning paper (not part of the installed
package).

Run them from the repository root as modules, e.g. ``python -m examples.spider.train --dry-run``.
"""
