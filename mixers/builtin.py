"""The in-repo mixers: importing a module registers it. One line per mixer."""

import mixers.deltanet  # noqa: F401
import mixers.gdn  # noqa: F401
import mixers.gla  # noqa: F401
import mixers.lin_gdn  # noqa: F401
import mixers.linear  # noqa: F401
import mixers.mesa  # noqa: F401
import mixers.softmax  # noqa: F401
