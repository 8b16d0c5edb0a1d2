"""The pictures in docs/images: the viewer's runs page with two ticked runs, a trajectory
replay and the playground, taken in headless Chromium from `agentgym-rl view RUNS` as a user
starts it, and the first run's `report/training.png`. Saved as 256-colour PNGs (a fifth of
Chromium's size, the same to the eye).

Usage: python scripts/screenshots.py RUNS RUN_A RUN_B [--metric val/success] [--out docs/images]
       (RUN_A, RUN_B: run names as the viewer lists them, e.g. screens/babyai_grpo)

How the committed pictures were made (docs/images/README.md says the same):
    agentgym-rl train configs/babyai_grpo.yaml --smoke run.output_dir=runs/screens train.steps=20 \
        train.validate_every=5 train.save_every=20 eval.episodes=10
    (the same for configs/babyai_rloo.yaml), then
    python scripts/screenshots.py runs screens/babyai_grpo_smoke screens/babyai_rloo_smoke
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parent.parent
VIEWPORT = {"width": 1280, "height": 860}


def small_png(source: Path | bytes, out: Path, width: int | None = None) -> None:
    """`source` (a PNG file or its bytes) as a 256-colour PNG, scaled down to `width` if wider."""
    image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source).convert("RGB")
    if width and image.width > width:
        image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    image.quantize(256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    print(f"{out}  {image.width}x{image.height}  {out.stat().st_size // 1024} KiB")


def start_viewer(runs: Path) -> tuple[subprocess.Popen, str]:
    viewer = subprocess.Popen([sys.executable, "-m", "agentgym_rl.cli", "view", str(runs), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in viewer.stdout:
        found = re.search(r"listening on (http://\S+?)/? ", line)
        if found:
            return viewer, found.group(1)
    raise SystemExit(f"the viewer did not start: {viewer.wait()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("--metric", default="val/success")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from agentgym_rl.envs.web.browser import LAUNCH_ARGS, find_chromium

    args.out.mkdir(parents=True, exist_ok=True)
    viewer, url = start_viewer(args.runs)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=find_chromium(), args=LAUNCH_ARGS)
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(url + "/")
            for name in (args.run_a, args.run_b):
                page.locator(f"input[data-run='{name}']").check()
            for box in page.locator("[data-testid=run-table] input[type=checkbox]").all():
                if box.get_attribute("data-run") not in (args.run_a, args.run_b):
                    box.uncheck()
            page.wait_for_function(f"[...document.querySelectorAll('#metric option')].some(o => o.value === '{args.metric}')")
            page.select_option("[data-testid=metric]", args.metric)
            page.wait_for_timeout(500)
            small_png(page.screenshot(), args.out / "viewer_runs.png")

            page.click("nav button[data-tab=trajectories]")
            page.select_option("[data-testid=t-run]", args.run_a)
            page.select_option("#t-split", "trajectories")
            page.select_option("[data-testid=t-success]", "true")  # a successful episode, if training had one
            page.wait_for_function("document.querySelector('[data-testid=t-count]').textContent.match(/^\\d/)")
            page.wait_for_timeout(300)
            if page.locator("[data-testid=t-count]").inner_text().startswith("0 "):
                page.select_option("[data-testid=t-success]", "")
                page.wait_for_function("document.querySelector('[data-testid=t-count]').textContent.includes('showing')")
            page.locator("[data-testid=t-table] tbody tr").first.click()
            page.locator("[data-testid=pane-a] [data-testid=turns] > li").first.wait_for()
            page.locator("[data-testid=t-count]").evaluate("e => e.scrollIntoView({block: 'start'})")
            small_png(page.screenshot(), args.out / "viewer_replay.png")

            page.click("nav button[data-tab=playground]")
            page.locator("[data-testid=p-item] option").first.wait_for(state="attached")
            page.select_option("[data-testid=p-run]", args.run_a)
            page.click("[data-testid=p-start]")
            page.wait_for_function("document.querySelector('[data-testid=p-status]').textContent.includes('turn 0')")
            for turn in (1, 2):
                page.click("[data-testid=p-model]")
                page.wait_for_function("document.querySelector('[data-testid=p-status]').textContent"
                                       f".match(/turn {turn}|episode over/)")
            small_png(page.screenshot(), args.out / "viewer_playground.png")
            browser.close()
    finally:
        viewer.terminate()
        viewer.wait(timeout=30)
    small_png(args.runs / args.run_a / "report" / "training.png", args.out / "training.png", width=1100)


if __name__ == "__main__":
    main()
