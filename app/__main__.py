"""python -m app [--model PATH] [--db PATH] [--screenshot PNG]"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from app import system_check
from engine.config import (  # imports no NumPy
    EngineConfig,
    configure_process,
    default_prompt_cache_dir,
)

NO_DISPLAY = """\
branchchat: no display found (DISPLAY and WAYLAND_DISPLAY are unset), so the window
cannot open. Options:
  - run it without a screen:   QT_QPA_PLATFORM=offscreen python -m app
  - run it in a virtual X:     xvfb-run python -m app
  - chat in the terminal:      python -m engine chat
  - render a screenshot:       python -m app --screenshot shot.png"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app", description="BranchChat desktop app")
    parser.add_argument(
        "--model", help="a GGUF file, a model folder or a shipped model's name (default: SmolLM2)"
    )
    parser.add_argument("--db", help="the conversation database (default: user data dir)")
    parser.add_argument("--screenshot", metavar="PNG", help="render the demo to PNG and exit")
    parser.add_argument("--dark", action="store_true", help="with --screenshot: dark theme")
    return parser.parse_args(argv)


def missing_display_message(env: dict[str, str] | None = None, platform: str = sys.platform):
    """The message to print when no window can be shown, or None when one can."""
    env = dict(os.environ) if env is None else env
    if not platform.startswith("linux"):
        return None
    if env.get("QT_QPA_PLATFORM") or env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    return NO_DISPLAY


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        # a conversation's computed state survives a restart (BRANCHCHAT_PROMPT_CACHE=off: not)
        config = EngineConfig.from_environment(prompt_cache_dir=default_prompt_cache_dir())
    except ValueError as exc:  # a malformed BRANCHCHAT_* variable
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_process(config)  # must precede the first NumPy import
    if args.screenshot:
        from app.window.demo import take_screenshot

        print(take_screenshot(args.screenshot, dark=args.dark))
        return 0
    message = missing_display_message()
    if message:
        print(message, file=sys.stderr)
        return 2
    missing = system_check.check_xcb()  # before Qt loads: its own message misleads
    if missing is not None:
        print(missing.message(has_apt=system_check.has_apt()), file=sys.stderr)
        return system_check.EXIT_MISSING
    return run_app(args, config)


def run_app(args: argparse.Namespace, config: EngineConfig) -> int:
    import qasync
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.bridge import EngineBridge, real_engine
    from app.conversation.store import ConversationStore
    from app.theme import apply_theme, system_theme
    from app.window.main_window import MainWindow

    qt_app = QApplication(sys.argv[:1])
    qt_app.setApplicationName("BranchChat")
    qt_app.setOrganizationName("branchchat")
    qt_app.setDesktopFileName("branchchat")  # Wayland matches the window to the launcher
    apply_theme(qt_app, system_theme())
    loop = qasync.QEventLoop(qt_app)
    asyncio.set_event_loop(loop)
    store = ConversationStore(args.db)
    store.purge_deleted()  # deletes from earlier sessions are past their undo
    window = MainWindow(store, EngineBridge(real_engine(config)), QSettings())
    window.restore_session()
    window.show()
    if args.model:
        window.model_loader.load(args.model)
    else:
        window.load_startup_model()
    closed = asyncio.Event()
    qt_app.aboutToQuit.connect(closed.set)
    with loop:
        loop.run_until_complete(closed.wait())
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
