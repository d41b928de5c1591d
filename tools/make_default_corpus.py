#!/usr/bin/env python3
"""Build ``nbrgc/data/default_corpus.txt``, the bundled ``default`` corpus: a few hundred KB of
English-like text that needs no network.

Everything here is written for nbrgc (no third-party text): a deterministic generator describes a small
made-up world -- people, towns and creatures with fixed facts that recur in different phrasings -- and
writes little stories, fact sheets, dialogues, ledgers with correct arithmetic, counting lines and
XML-ish records about it. It is learnable (agreement, balanced tags, consistent facts, sums) and varied.

The package only reads the shipped file (``nbrgc.data.default``); this build tool is what wrote it, and
``tests/test_data.py`` checks that it still writes the same bytes. Run ``python3
tools/make_default_corpus.py`` to rewrite the file after changing the generator.
"""
from __future__ import annotations

from pathlib import Path

CORPUS_FILE = Path(__file__).resolve().parent.parent / "nbrgc" / "data" / "default_corpus.txt"
SEED = 20240917
TARGET_BYTES = 262_144

_M64 = (1 << 64) - 1


class _Rng:
    """splitmix64: tiny, and identical on every platform and Python version."""

    def __init__(self, seed):
        self.s = seed & _M64

    def u64(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & _M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        return z ^ (z >> 31)

    def below(self, n):
        return self.u64() % n

    def between(self, lo, hi):  # inclusive
        return lo + self.below(hi - lo + 1)

    def choice(self, seq):
        return seq[self.below(len(seq))]

    def chance(self, p):
        return self.u64() < int(p * (1 << 64))

    def sample(self, seq, k):
        pool = list(seq)
        out = []
        for _ in range(min(k, len(pool))):
            out.append(pool.pop(self.below(len(pool))))
        return out


_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
         "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n):
    if n < 20:
        return _ONES[n]
    if n < 100:
        t, o = divmod(n, 10)
        return _TENS[t] + ("" if o == 0 else "-" + _ONES[o])
    if n < 1000:
        h, r = divmod(n, 100)
        return _ONES[h] + " hundred" + ("" if r == 0 else " and " + number_words(r))
    th, r = divmod(n, 1000)
    return number_words(th) + " thousand" + ("" if r == 0 else (" and " if r < 100 else " ") + number_words(r))


def _cap(s):
    return s[:1].upper() + s[1:]


def _plural(word):
    irregular = {"mouse": "mice", "goose": "geese", "loaf": "loaves", "knife": "knives", "shelf": "shelves",
                 "sheep": "sheep", "fish": "fish", "child": "children", "leaf": "leaves"}
    head, _, last = word.rpartition(" ")
    if last in irregular:
        p = irregular[last]
    elif last.endswith(("s", "x", "ch", "sh")):
        p = last + "es"
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        p = last[:-1] + "ies"
    else:
        p = last + "s"
    return (head + " " + p) if head else p


def _count(n, word):
    return f"{number_words(n)} {word if n == 1 else _plural(word)}"


def _a(word):
    return ("an " if word[:1] in "aeiou" else "a ") + word


# ---------------------------------------------------------------------------------------------- the world
_FIRST = [("Mira", "she"), ("Tobin", "he"), ("Alder", "he"), ("Suvi", "she"), ("Hesper", "she"),
          ("Rook", "he"), ("Ilka", "she"), ("Corwen", "he"), ("Dassa", "she"), ("Pell", "he"),
          ("Wrenna", "she"), ("Oskel", "he"), ("Thimble", "she"), ("Garrow", "he"), ("Lune", "she"),
          ("Brannock", "he"), ("Yselde", "she"), ("Fenn", "he"), ("Marigold", "she"), ("Quill", "he"),
          ("Sabeth", "she"), ("Tarrant", "he"), ("Nessa", "she"), ("Ambrel", "he")]
_FAMILY = ["Quell", "Ashgrove", "Pennant", "Morrow", "Tallis", "Brack", "Wendle", "Oakhart", "Sorrel",
           "Hobb", "Carrow", "Linden", "Fairweather", "Gask", "Emberly", "Thorne"]
_TOWNS = ["Vellmoor", "Orrin Bay", "Tamsk", "Lowbridge", "Quillon", "Harrowgate", "Fennick", "Saltmere",
          "Brindle Cross", "Upper Wick", "Kettering Reach", "Dunmarrow"]
_JOBS = ["lamp maker", "ferry keeper", "baker", "clock mender", "beekeeper", "map drawer", "weaver",
         "potter", "bell ringer", "shepherd", "boat builder", "letter carrier", "gardener", "cheese maker",
         "glassblower", "rope maker"]
_CREATURES = ["glimmet", "thornback", "mossfinch", "dunrat", "skelk", "brindleworm", "wicker-cat",
              "zorblat", "lantern moth", "puddle hound", "quarrow", "fen goat", "hollow owl", "tumblebee"]
_COLOURS = ["red", "blue", "green", "grey", "golden", "black", "white", "brown", "silver", "orange",
            "purple", "yellow"]
_FOODS = ["moss", "berries", "small stones", "clover", "beetles", "bread crusts", "river weed", "acorns",
          "honey", "turnips", "seeds", "rain water"]
_HABITATS = ["the Copper Hills", "Fennick Wood", "the salt marsh", "the old quarry", "the reed beds",
             "the high meadows", "the cellars of Tamsk", "the cliffs above Orrin Bay", "the birch forest",
             "the dunes"]
# (present, past)
_SOUNDS = [("hums", "hummed"), ("clicks", "clicked"), ("whistles", "whistled"), ("chirps", "chirped"),
           ("croaks", "croaked"), ("purrs", "purred"), ("hisses", "hissed"), ("sings", "sang"),
           ("rattles", "rattled"), ("hoots", "hooted")]
_OBJECTS = ["lantern", "map", "kettle", "drum", "compass", "basket", "ladder", "letter", "coin", "bell",
            "key", "boat", "scarf", "clock", "spoon", "candle", "hat", "book", "jar", "box", "whistle",
            "blanket", "knife", "loaf", "shelf", "button", "rope", "cup"]
_ADJS = ["small", "old", "bright", "quiet", "heavy", "round", "strange", "warm", "broken", "shiny",
         "tiny", "tall", "soft", "dusty", "new", "cold", "lucky", "crooked"]
_MOODS = ["happy", "tired", "worried", "curious", "cheerful", "sleepy", "proud", "grumpy", "brave", "calm"]
_PLACES_IN = ["under the bridge", "behind the mill", "in the attic", "near the well", "by the harbour",
              "on the hill", "in the market", "beside the river", "at the station", "in the orchard",
              "under the stairs", "inside the barn"]
_TIMES = ["In the morning", "At noon", "That evening", "On the third day",
          "After supper", "Early one spring", "Late in the autumn", "At dawn", "One windy night"]
_WEATHER = ["it was raining", "the sun was shining", "a fog rolled in", "snow was falling",
            "the wind was strong", "the sky was clear", "thunder rumbled far away", "it was very hot"]
# (base, past, third person singular)
_VERBS_OBJ = [("find", "found", "finds"), ("carry", "carried", "carries"), ("mend", "mended", "mends"),
              ("paint", "painted", "paints"), ("hide", "hid", "hides"), ("polish", "polished", "polishes"),
              ("sell", "sold", "sells"), ("borrow", "borrowed", "borrows"), ("drop", "dropped", "drops"),
              ("wrap", "wrapped", "wraps"), ("clean", "cleaned", "cleans"), ("buy", "bought", "buys"),
              ("make", "made", "makes"), ("give away", "gave away", "gives away")]
_VERBS_GO = [("walk", "walked"), ("ride", "rode"), ("sail", "sailed"), ("run", "ran"), ("travel", "travelled"),
             ("hurry", "hurried"), ("wander", "wandered")]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_PRON = {"he": ("he", "him", "his"), "she": ("she", "her", "her")}


class _World:
    def __init__(self, rng):
        self.people = []
        fams = list(_FAMILY)
        for i, (first, pron) in enumerate(_FIRST):
            self.people.append({
                "id": 100 + 7 * i,
                "first": first, "last": fams[i % len(fams)], "pron": pron,
                "age": rng.between(9, 81), "town": rng.choice(_TOWNS), "job": rng.choice(_JOBS),
                "pet": rng.choice(_CREATURES), "colour": rng.choice(_COLOURS),
            })
        self.creatures = []
        for i, c in enumerate(_CREATURES):
            self.creatures.append({
                "id": 500 + 3 * i, "name": c, "colour": rng.choice(_COLOURS), "food": rng.choice(_FOODS),
                "home": rng.choice(_HABITATS), "legs": rng.choice([0, 2, 4, 6, 8]),
                "sound": rng.choice(_SOUNDS), "size": rng.choice(["tiny", "small", "large", "huge"]),
            })
        self.towns = {}
        for t in _TOWNS:
            self.towns[t] = {"people": 100 * rng.between(4, 90), "bridges": rng.between(0, 9),
                             "market": rng.choice(_DAYS), "river": rng.choice(["the Sel", "the Ambry",
                                                                               "the Long Water", "the Tarn"])}


# ------------------------------------------------------------------------------------------- doc kinds
def _story(rng, w):
    p = rng.choice(w.people)
    friend = rng.choice([q for q in w.people if q is not p])
    he, him, his = _PRON[p["pron"]]
    fhe = _PRON[friend["pron"]][0]
    obj = rng.choice(_OBJECTS)
    adj = rng.choice(_ADJS)
    title = rng.choice([f"The {_cap(adj)} {_cap(obj)}", f"{p['first']} and the {_cap(obj)}",
                        f"How {p['first']} Found the {_cap(obj)}", f"A Day in {p['town']}"])
    s = [f"Once there was {_a(p['job'])} called {p['first']} {p['last']} who lived in {p['town']}."]
    s.append(f"{_cap(he)} was {number_words(p['age'])} years old and had {_a(p['colour'] + ' ' + p['pet'])}.")
    verb = rng.choice(_VERBS_OBJ)
    s.append(f"Every day {he} {verb[2]} {_a(rng.choice(_ADJS) + ' ' + rng.choice(_OBJECTS))}.")
    s.append(f"{rng.choice(_TIMES)}, {rng.choice(_WEATHER)}, and {p['first']} lost {his} {adj} {obj}.")
    places = rng.sample(_PLACES_IN, rng.between(2, 4))
    for pl in places[:-1]:
        s.append(rng.choice([f"{_cap(he)} looked {pl}, but it was not there.",
                             f"{_cap(he)} searched {pl}. Nothing.",
                             f"It was not {pl} either."]))
    s.append(f'"Have you seen my {obj}?" {he} asked {friend["first"]}.')
    s.append(rng.choice([f'"No," said {friend["first"]}, "but I will help you look."',
                         f'"Try {places[-1]}," said {friend["first"]}.',
                         f'"I saw something {places[-1]}," {fhe} said.']))
    s.append(f"At last they found the {obj} {places[-1]}.")
    mood = rng.choice(_MOODS)
    s.append(f"{p['first']} was {mood}, and {his} {p['pet']} {rng.choice(_SOUNDS)[1]} loudly.")
    if rng.chance(0.5):
        n = rng.between(2, 12)
        s.append(f"To say thank you, {he} gave {friend['first']} {_count(n, rng.choice(_OBJECTS))}.")
    s.append("The end.")
    body = " ".join(s)
    return "story", f"Title: {title}\n\n{_wrap(body)}\n"


def _facts(rng, w):
    c = rng.choice(w.creatures)
    name, plural = c["name"], _plural(c["name"])
    lines = [f"== The {name} ==", ""]
    opts = [
        f"The {name} lives in {c['home']}.",
        f"{_cap(plural)} eat {c['food']}.",
        f"{_cap(_a(name))} has {_count(c['legs'], 'leg') if c['legs'] else 'no legs'}.",
        f"The {name} is {c['size']} and {c['colour']}.",
        f"When it is happy, the {name} {c['sound'][0]}.",
        f"You can find {plural} in {c['home']} but not in the towns.",
        f"{_cap(_a(c['colour'] + ' ' + name))} is easy to see.",
        f"Most {plural} sleep in the day and eat {c['food']} at night.",
    ]
    owners = [p for p in w.people if p["pet"] == name]
    if owners:
        o = rng.choice(owners)
        opts.append(f"{o['first']} {o['last']} of {o['town']} keeps {_a(o['colour'] + ' ' + name)}.")
    lines.append(_wrap(" ".join(rng.sample(opts, rng.between(3, len(opts))))))
    return "facts", "\n".join(lines) + "\n"


def _person(rng, w):
    p = rng.choice(w.people)
    he, him, his = _PRON[p["pron"]]
    t = w.towns[p["town"]]
    first = f"{p['first']} {p['last']} is {_a(p['job'])} in {p['town']}."
    opts = [
        f"{_cap(he)} is {p['age']} years old.",
        f"{p['first']} has {_a(p['colour'] + ' ' + p['pet'])}.",
        f"The market in {p['town']} is on {t['market']}, so {he} goes there every {t['market']}.",
        f"{p['town']} has {number_words(t['bridges']) if t['bridges'] else 'no'} "
        f"{'bridge' if t['bridges'] == 1 else 'bridges'} over {t['river']}.",
        f"About {t['people']:,} people live in {p['town']}.",
    ]
    return "person", _wrap(" ".join([first] + rng.sample(opts, rng.between(2, len(opts))))) + "\n"


def _record(rng, w):
    if rng.chance(0.6):
        p = rng.choice(w.people)
        lines = [f'<person id="{p["id"]}">',
                 f"  <name>{p['first']} {p['last']}</name>",
                 f"  <age>{p['age']}</age>",
                 f"  <town>{p['town']}</town>",
                 f"  <job>{p['job']}</job>"]
        if rng.chance(0.7):
            lines.append(f'  <pet colour="{p["colour"]}">{p["pet"]}</pet>')
        lines.append("</person>")
    else:
        c = rng.choice(w.creatures)
        lines = [f'<creature id="{c["id"]}" size="{c["size"]}">',
                 f"  <name>{c['name']}</name>",
                 f"  <colour>{c['colour']}</colour>",
                 f"  <legs>{c['legs']}</legs>",
                 f"  <food>{c['food']}</food>",
                 f"  <home>{c['home']}</home>",
                 "</creature>"]
    return "record", "\n".join(lines) + "\n"


def _arith(rng, w):
    lines = []
    for _ in range(rng.between(4, 9)):
        k = rng.below(6)
        a, b = rng.between(0, 99), rng.between(0, 99)
        if k == 0:
            lines.append(f"{a} + {b} = {a + b}")
        elif k == 1:
            a, b = max(a, b), min(a, b)
            lines.append(f"{a} - {b} = {a - b}")
        elif k == 2:
            a, b = a % 13, b % 13
            lines.append(f"{a} x {b} = {a * b}")
        elif k == 3:
            a, b = a % 20, b % 20
            lines.append(f"{_cap(number_words(a))} plus {number_words(b)} is {number_words(a + b)}.")
        elif k == 4:
            a, b = a % 11, b % 11
            lines.append(f"{_cap(number_words(a))} times {number_words(b)} is {number_words(a * b)}.")
        else:
            b = max(1, b % 12)
            q = a % 12
            lines.append(f"{q * b} / {b} = {q}")
    return "sums", "\n".join(lines) + "\n"


def _ledger(rng, w):
    p = rng.choice(w.people)
    lines = [f"Ledger of {p['first']} {p['last']}, {p['job']}, {p['town']}"]
    total = 0
    start = rng.below(7)
    for i in range(rng.between(3, 7)):
        day = _DAYS[(start + i) % 7]
        obj = rng.choice(_OBJECTS)
        n, price = rng.between(1, 12), rng.between(1, 9)
        total += n * price
        coins = "coin" if price == 1 else "coins"
        lines.append(f"{day}: sold {_count(n, obj)} at {price} {coins} each = {n * price} coins")
    lines.append(f"Total: {total} coins")
    return "ledger", "\n".join(lines) + "\n"


def _counting(rng, w):
    p = rng.choice(w.people)
    he = _PRON[p["pron"]][0]
    obj = rng.choice(_OBJECTS + [c["name"] for c in w.creatures])
    n = rng.between(2, 15)
    seq = ", ".join(number_words(i) for i in range(1, n + 1))
    return "counting", _wrap(f"{p['first']} counted the {_plural(obj)}: {seq}. There were {_count(n, obj)}. "
                             f"Then {he} counted back: "
                             f"{', '.join(number_words(i) for i in range(n, 0, -1))}.") + "\n"


def _dialogue(rng, w):
    a, b = rng.sample(w.people, 2)
    c = rng.choice(w.creatures)
    lines = [f"{a['first']}: Good morning, {b['first']}. Where are you going?",
             f"{b['first']}: To {rng.choice(_TOWNS)}. The market is on {w.towns[b['town']]['market']}.",
             f"{a['first']}: Did you see the {c['name']} {rng.choice(_PLACES_IN)}?",
             f"{b['first']}: Yes. It was {c['colour']}, and it {c['sound'][1]} when I came near.",
             f"{a['first']}: {_cap(_plural(c['name']))} eat {c['food']}, you know.",
             f"{b['first']}: {rng.choice(['I know.', 'I did not know that.', 'So I have heard.'])}"]
    if rng.chance(0.5):
        go = rng.choice(_VERBS_GO)
        lines.append(f"And so {b['first']} {go[1]} on to {rng.choice(_TOWNS)}, and {a['first']} went home.")
    return "dialogue", "\n".join(lines) + "\n"


def _weather(rng, w):
    town = rng.choice(_TOWNS)
    start = rng.below(7)
    lines = [f"Weather for {town}, the week starting {_DAYS[start]}"]
    for i in range(rng.between(3, 7)):
        lo = rng.between(-5, 15)
        hi = lo + rng.between(2, 12)
        wind = rng.choice(["north", "south", "east", "west", "north-west", "south-east"])
        sky = rng.choice(["rain", "sun", "fog", "snow", "clouds", "showers", "storms"])
        lines.append(f"{_DAYS[(start + i) % 7]}: {sky}, {lo} to {hi} degrees, wind from the {wind}")
    return "weather", "\n".join(lines) + "\n"


def _letter(rng, w):
    a, b = rng.sample(w.people, 2)
    c = rng.choice(w.creatures)
    obj = rng.choice(_OBJECTS)
    n = rng.between(2, 9)
    go = rng.choice(_VERBS_GO)
    body = [f"Dear {b['first']},", ""]
    para = [f"I am writing to you from {a['town']}, where {rng.choice(_WEATHER)}.",
            f"Last week I {go[1]} to {rng.choice(_HABITATS)} and saw {_count(n, c['name'])}.",
            f"They were {c['colour']} and they {c['sound'][1]} all night.",
            f"Work is going well: I am still {_a(a['job'])}, and I have made {_count(n + 3, obj)} this month.",
            f"Please give my best to your {b['pet']}."]
    body.append(_wrap(" ".join(para[:2] + rng.sample(para[2:], rng.between(1, 3)))))
    body += ["", rng.choice(["Yours,", "With love,", "Your friend,", "Best wishes,"]), f"{a['first']} {a['last']}"]
    return "letter", "\n".join(body) + "\n"


def _wrap(text, width=96):
    out, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(line)
    return "\n".join(out)


_KINDS = [(_story, 5), (_facts, 2), (_person, 2), (_record, 3), (_arith, 2), (_ledger, 1), (_counting, 1),
          (_dialogue, 2), (_weather, 1), (_letter, 2)]


def generate_corpus(target_bytes=TARGET_BYTES, seed=SEED) -> bytes:
    """The default corpus as ASCII bytes, deterministic in (target_bytes, seed); ends at a document end."""
    rng = _Rng(seed)
    world = _World(_Rng(seed ^ 0x5EED))
    table = [f for f, wgt in _KINDS for _ in range(wgt)]
    parts, size, i = [], 0, 0
    while size < target_bytes:
        kind, body = rng.choice(table)(rng, world)
        doc = f'<doc id="{i}" kind="{kind}">\n{body}</doc>\n\n'
        parts.append(doc)
        size += len(doc)
        i += 1
    return "".join(parts).encode("ascii")


def main():
    CORPUS_FILE.write_bytes(generate_corpus())
    print(f"wrote {CORPUS_FILE} ({CORPUS_FILE.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
