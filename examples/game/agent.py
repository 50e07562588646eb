"""A number-guessing agent: the model guesses a secret number and is told "higher" or "lower" after each guess.

This is an ordinary agent written with the plain ``openai`` client and no knowledge of Agent Lightning; it is
trained, unmodified, by ``train.py`` next to it. Play one game against any OpenAI-compatible endpoint:

    python -m examples.game.agent --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-0.5B-Instruct
"""

from __future__ import annotations

import argparse
import random
import re
from dataclasses import dataclass, field

from openai import OpenAI

SYSTEM_PROMPT = (
    "You are playing a number-guessing game. The host has picked a secret whole number in a range. Each turn, "
    "reply with your reasoning in one short sentence, then your guess as 'GUESS: <number>'. The host answers "
    "'higher' if the secret is larger than your guess, 'lower' if it is smaller, or 'correct'."
)
_GUESS = re.compile(r"GUESS:\s*(-?\d+)", re.IGNORECASE)


@dataclass
class NumberGame:
    """The host: holds the secret and judges guesses."""

    secret: int
    low: int = 1
    high: int = 100
    max_guesses: int = 7
    guesses: list[int] = field(default_factory=list)

    @property
    def solved(self) -> bool:
        """Whether the last guess was the secret."""
        return bool(self.guesses) and self.guesses[-1] == self.secret

    @property
    def over(self) -> bool:
        """Solved, or out of guesses."""
        return self.solved or len(self.guesses) >= self.max_guesses

    def judge(self, guess: int) -> str:
        """Record ``guess`` and say 'correct', 'higher' or 'lower'."""
        self.guesses.append(guess)
        if guess == self.secret:
            return "correct"
        return "higher" if self.secret > guess else "lower"


class GuessingAgent:
    """Plays a :class:`NumberGame` with a chat model."""

    def __init__(self, client: OpenAI, model: str, temperature: float = 0.7) -> None:
        self.client = client
        self.model = model
        self.temperature = temperature

    def play(self, game: NumberGame) -> bool:
        """Play until the game is over; True if the secret was found."""
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {
                "role": "user",
                "content": f"The secret is between {game.low} and {game.high}. "
                f"You have {game.max_guesses} guesses. Your first guess?",
            },
        ]
        while not game.over:
            response = self.client.chat.completions.create(
                model=self.model, messages=messages, temperature=self.temperature, max_tokens=128
            )
            reply = response.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": reply})
            found = _GUESS.search(reply)
            if found is None:
                game.guesses.append(game.low - 1)  # an unreadable turn still uses up a guess
                feedback = "I could not read a guess. Answer with 'GUESS: <number>'."
            else:
                verdict = game.judge(int(found.group(1)))
                feedback = {"correct": "Correct!", "higher": "higher", "lower": "lower"}[verdict]
            left = game.max_guesses - len(game.guesses)
            messages.append({"role": "user", "content": f"{feedback} ({left} guesses left)"})
        return game.solved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="EMPTY")
    arguments = parser.parse_args()
    game = NumberGame(secret=random.randint(1, 100))
    won = GuessingAgent(OpenAI(base_url=arguments.base_url, api_key=arguments.api_key), arguments.model).play(game)
    print(f"secret {game.secret}, guesses {game.guesses}: {'won' if won else 'lost'}")


if __name__ == "__main__":
    main()
