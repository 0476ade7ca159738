"""Generate the small shipped search_qa set (ragen/data/search_qa) from hand-written fact tables.

Writes corpus.jsonl (200 passages: {id, title, text}) and qa.jsonl (50 questions: {id, question, answers}),
deterministically. Usage: python scripts/make_search_qa_data.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

# country, capital, continent, currency, main language, capital fact
COUNTRIES = [
    ("France", "Paris", "Europe", "euro", "French", "lies on the Seine river"),
    ("Germany", "Berlin", "Europe", "euro", "German", "was divided by a wall from 1961 to 1989"),
    ("Italy", "Rome", "Europe", "euro", "Italian", "surrounds the Vatican City"),
    ("Spain", "Madrid", "Europe", "euro", "Spanish", "is home to the Prado Museum"),
    ("Portugal", "Lisbon", "Europe", "euro", "Portuguese", "sits at the mouth of the Tagus river"),
    ("Netherlands", "Amsterdam", "Europe", "euro", "Dutch", "is known for its canals"),
    ("Belgium", "Brussels", "Europe", "euro", "Dutch, French and German", "hosts many European Union institutions"),
    ("Austria", "Vienna", "Europe", "euro", "German", "lies on the Danube river"),
    ("Switzerland", "Bern", "Europe", "Swiss franc", "German, French, Italian and Romansh", "lies on the Aare"),
    ("Poland", "Warsaw", "Europe", "zloty", "Polish", "lies on the Vistula river"),
    ("Sweden", "Stockholm", "Europe", "Swedish krona", "Swedish", "is built on fourteen islands"),
    ("Norway", "Oslo", "Europe", "Norwegian krone", "Norwegian", "sits at the head of the Oslofjord"),
    ("Finland", "Helsinki", "Europe", "euro", "Finnish and Swedish", "faces the Gulf of Finland"),
    ("Greece", "Athens", "Europe", "euro", "Greek", "is crowned by the Acropolis"),
    ("Hungary", "Budapest", "Europe", "forint", "Hungarian", "joins Buda and Pest across the Danube"),
    ("Ireland", "Dublin", "Europe", "euro", "Irish and English", "lies on the river Liffey"),
    ("Turkey", "Ankara", "Asia", "Turkish lira", "Turkish", "became the capital in 1923"),
    ("Japan", "Tokyo", "Asia", "yen", "Japanese", "was formerly called Edo"),
    ("China", "Beijing", "Asia", "renminbi", "Mandarin Chinese", "contains the Forbidden City"),
    ("India", "New Delhi", "Asia", "Indian rupee", "Hindi and English", "was designed by Edwin Lutyens"),
    ("South Korea", "Seoul", "Asia", "won", "Korean", "lies on the Han river"),
    ("Thailand", "Bangkok", "Asia", "baht", "Thai", "lies on the Chao Phraya river"),
    ("Vietnam", "Hanoi", "Asia", "dong", "Vietnamese", "lies on the Red River"),
    ("Indonesia", "Jakarta", "Asia", "rupiah", "Indonesian", "lies on the island of Java"),
    ("Pakistan", "Islamabad", "Asia", "Pakistani rupee", "Urdu and English", "was built in the 1960s"),
    ("Egypt", "Cairo", "Africa", "Egyptian pound", "Arabic", "lies on the Nile"),
    ("Kenya", "Nairobi", "Africa", "Kenyan shilling", "Swahili and English", "has a national park within it"),
    ("Nigeria", "Abuja", "Africa", "naira", "English", "replaced Lagos as capital in 1991"),
    ("Morocco", "Rabat", "Africa", "Moroccan dirham", "Arabic and Berber", "lies on the Atlantic coast"),
    ("Ethiopia", "Addis Ababa", "Africa", "birr", "Amharic", "hosts the African Union"),
    ("Ghana", "Accra", "Africa", "cedi", "English", "lies on the Gulf of Guinea"),
    ("Canada", "Ottawa", "North America", "Canadian dollar", "English and French", "lies on the Ottawa River"),
    ("Mexico", "Mexico City", "North America", "Mexican peso", "Spanish", "was built on the ruins of Tenochtitlan"),
    ("Cuba", "Havana", "North America", "Cuban peso", "Spanish", "is famous for its old colonial centre"),
    ("Brazil", "Brasilia", "South America", "real", "Portuguese", "was planned by Lucio Costa and Oscar Niemeyer"),
    ("Argentina", "Buenos Aires", "South America", "Argentine peso", "Spanish", "lies on the Rio de la Plata"),
    ("Peru", "Lima", "South America", "sol", "Spanish", "was founded by Francisco Pizarro"),
    ("Chile", "Santiago", "South America", "Chilean peso", "Spanish", "lies in a valley below the Andes"),
    ("Australia", "Canberra", "Oceania", "Australian dollar", "English", "was chosen as a compromise"),
    ("New Zealand", "Wellington", "Oceania", "New Zealand dollar", "English and Maori", "is known as windy"),
]
# name, symbol, atomic number, group description
ELEMENTS = [
    ("Hydrogen", "H", 1, "the lightest element"), ("Helium", "He", 2, "a noble gas"),
    ("Lithium", "Li", 3, "an alkali metal"), ("Carbon", "C", 6, "the basis of organic chemistry"),
    ("Nitrogen", "N", 7, "most of the air"), ("Oxygen", "O", 8, "a gas needed for breathing"),
    ("Fluorine", "F", 9, "a halogen"), ("Neon", "Ne", 10, "a noble gas used in signs"),
    ("Sodium", "Na", 11, "an alkali metal"), ("Magnesium", "Mg", 12, "an alkaline earth metal"),
    ("Aluminium", "Al", 13, "a light metal"), ("Silicon", "Si", 14, "a semiconductor"),
    ("Phosphorus", "P", 15, "a nonmetal found in bones"), ("Sulfur", "S", 16, "a yellow nonmetal"),
    ("Chlorine", "Cl", 17, "a halogen"), ("Argon", "Ar", 18, "a noble gas"),
    ("Potassium", "K", 19, "an alkali metal"), ("Calcium", "Ca", 20, "an alkaline earth metal"),
    ("Iron", "Fe", 26, "a transition metal"), ("Copper", "Cu", 29, "a reddish transition metal"),
    ("Zinc", "Zn", 30, "a transition metal"), ("Silver", "Ag", 47, "a precious metal"),
    ("Tin", "Sn", 50, "a post-transition metal"), ("Iodine", "I", 53, "a halogen"),
    ("Platinum", "Pt", 78, "a precious metal"), ("Gold", "Au", 79, "a precious metal"),
    ("Mercury", "Hg", 80, "a metal that is liquid at room temperature"), ("Lead", "Pb", 82, "a heavy metal"),
    ("Uranium", "U", 92, "a radioactive actinide"), ("Tungsten", "W", 74, "the metal with the highest melting point"),
]
# planet, order from the sun, fact
PLANETS = [
    ("Mercury", 1, "the smallest planet"), ("Venus", 2, "the hottest planet"),
    ("Earth", 3, "the only known planet with life"),
    ("Mars", 4, "the red planet"), ("Jupiter", 5, "the largest planet"), ("Saturn", 6, "famous for its rings"),
    ("Uranus", 7, "rotates on its side"), ("Neptune", 8, "the farthest planet from the sun"),
]
# book, author, year, author aliases
BOOKS = [
    ("Nineteen Eighty-Four", "George Orwell", 1949, ["Orwell", "Eric Arthur Blair"]),
    ("Pride and Prejudice", "Jane Austen", 1813, ["Austen"]),
    ("Moby-Dick", "Herman Melville", 1851, ["Melville"]),
    ("War and Peace", "Leo Tolstoy", 1869, ["Tolstoy", "Lev Tolstoy"]),
    ("Don Quixote", "Miguel de Cervantes", 1605, ["Cervantes"]),
    ("The Great Gatsby", "F. Scott Fitzgerald", 1925, ["Fitzgerald", "Scott Fitzgerald"]),
    ("Frankenstein", "Mary Shelley", 1818, ["Shelley", "Mary Wollstonecraft Shelley"]),
    ("Crime and Punishment", "Fyodor Dostoevsky", 1866, ["Dostoevsky", "Dostoyevsky"]),
    ("One Hundred Years of Solitude", "Gabriel Garcia Marquez", 1967, ["Garcia Marquez", "Gabo"]),
    ("To Kill a Mockingbird", "Harper Lee", 1960, ["Lee"]),
    ("Jane Eyre", "Charlotte Bronte", 1847, ["Bronte"]),
    ("Wuthering Heights", "Emily Bronte", 1847, ["Bronte"]),
    ("The Hobbit", "J. R. R. Tolkien", 1937, ["Tolkien", "JRR Tolkien"]),
    ("Brave New World", "Aldous Huxley", 1932, ["Huxley"]),
    ("The Old Man and the Sea", "Ernest Hemingway", 1952, ["Hemingway"]),
    ("Great Expectations", "Charles Dickens", 1861, ["Dickens"]),
    ("Dracula", "Bram Stoker", 1897, ["Stoker"]),
    ("Les Miserables", "Victor Hugo", 1862, ["Hugo"]),
    ("The Trial", "Franz Kafka", 1925, ["Kafka"]),
    ("Ulysses", "James Joyce", 1922, ["Joyce"]),
    ("Madame Bovary", "Gustave Flaubert", 1857, ["Flaubert"]),
    ("The Catcher in the Rye", "J. D. Salinger", 1951, ["Salinger"]),
    ("Lord of the Flies", "William Golding", 1954, ["Golding"]),
    ("Beloved", "Toni Morrison", 1987, ["Morrison"]),
    ("The Divine Comedy", "Dante Alighieri", 1320, ["Dante"]),
    ("Anna Karenina", "Leo Tolstoy", 1878, ["Tolstoy", "Lev Tolstoy"]),
    ("Hamlet", "William Shakespeare", 1601, ["Shakespeare"]),
    ("The Odyssey", "Homer", -700, ["Homer"]),
    ("Robinson Crusoe", "Daniel Defoe", 1719, ["Defoe"]),
    ("Gulliver's Travels", "Jonathan Swift", 1726, ["Swift"]),
]
# painting, painter, museum, painter aliases
PAINTINGS = [
    ("Mona Lisa", "Leonardo da Vinci", "the Louvre in Paris", ["Leonardo", "da Vinci"]),
    ("The Starry Night", "Vincent van Gogh", "the Museum of Modern Art in New York", ["van Gogh"]),
    ("The Persistence of Memory", "Salvador Dali", "the Museum of Modern Art in New York", ["Dali"]),
    ("Guernica", "Pablo Picasso", "the Reina Sofia museum in Madrid", ["Picasso"]),
    ("The Birth of Venus", "Sandro Botticelli", "the Uffizi Gallery in Florence", ["Botticelli"]),
    ("The Night Watch", "Rembrandt", "the Rijksmuseum in Amsterdam", ["Rembrandt van Rijn"]),
    ("Girl with a Pearl Earring", "Johannes Vermeer", "the Mauritshuis in The Hague", ["Vermeer"]),
    ("The Scream", "Edvard Munch", "the National Museum in Oslo", ["Munch"]),
    ("The Last Supper", "Leonardo da Vinci", "Santa Maria delle Grazie in Milan", ["Leonardo", "da Vinci"]),
    ("Water Lilies", "Claude Monet", "the Musee de l'Orangerie in Paris", ["Monet"]),
    ("The Kiss", "Gustav Klimt", "the Belvedere in Vienna", ["Klimt"]),
    ("American Gothic", "Grant Wood", "the Art Institute of Chicago", ["Wood"]),
    ("The Garden of Earthly Delights", "Hieronymus Bosch", "the Prado in Madrid", ["Bosch"]),
    ("Las Meninas", "Diego Velazquez", "the Prado in Madrid", ["Velazquez"]),
    ("The Great Wave off Kanagawa", "Katsushika Hokusai", "many collections as a woodblock print", ["Hokusai"]),
    ("Liberty Leading the People", "Eugene Delacroix", "the Louvre in Paris", ["Delacroix"]),
    ("The Creation of Adam", "Michelangelo", "the Sistine Chapel ceiling", ["Michelangelo Buonarroti"]),
    ("A Sunday Afternoon on the Island of La Grande Jatte", "Georges Seurat", "the Art Institute of Chicago",
     ["Seurat"]),
    ("Nighthawks", "Edward Hopper", "the Art Institute of Chicago", ["Hopper"]),
    ("The Arnolfini Portrait", "Jan van Eyck", "the National Gallery in London", ["van Eyck"]),
]
# invention, inventor, year, inventor aliases
INVENTIONS = [
    ("telephone", "Alexander Graham Bell", 1876, ["Graham Bell", "Bell"]),
    ("light bulb with a carbon filament", "Thomas Edison", 1879, ["Edison"]),
    ("printing press with movable type", "Johannes Gutenberg", 1440, ["Gutenberg"]),
    ("World Wide Web", "Tim Berners-Lee", 1989, ["Berners-Lee"]),
    ("dynamite", "Alfred Nobel", 1867, ["Nobel"]),
    ("penicillin", "Alexander Fleming", 1928, ["Fleming"]),
    ("steam engine with a separate condenser", "James Watt", 1769, ["Watt"]),
    ("radio transmitter", "Guglielmo Marconi", 1895, ["Marconi"]),
    ("airplane", "the Wright brothers", 1903, ["Wright brothers", "Orville and Wilbur Wright"]),
    ("phonograph", "Thomas Edison", 1877, ["Edison"]),
    ("alternating current induction motor", "Nikola Tesla", 1888, ["Tesla"]),
    ("polio vaccine", "Jonas Salk", 1955, ["Salk"]),
    ("periodic table", "Dmitri Mendeleev", 1869, ["Mendeleev"]),
    ("mercury thermometer", "Daniel Fahrenheit", 1714, ["Fahrenheit"]),
    ("safety elevator", "Elisha Otis", 1852, ["Otis"]),
    ("television system", "John Logie Baird", 1926, ["Baird"]),
    ("diesel engine", "Rudolf Diesel", 1893, ["Diesel"]),
    ("battery", "Alessandro Volta", 1800, ["Volta"]),
    ("cotton gin", "Eli Whitney", 1793, ["Whitney"]),
    ("jet engine", "Frank Whittle", 1930, ["Whittle"]),
]
# river or mountain, fact sentence, question, answer aliases
GEOGRAPHY = [
    ("Nile", "The Nile flows north through Egypt into the Mediterranean Sea and is often called the longest river "
     "in the world.", None, None),
    ("Amazon", "The Amazon river in South America carries more water than any other river.",
     "Which river carries more water than any other river?", ["Amazon", "Amazon River"]),
    ("Danube", "The Danube flows through ten countries, including Austria and Hungary, into the Black Sea.",
     "Which river flows through ten countries into the Black Sea?", ["Danube", "Danube River"]),
    ("Mount Everest", "Mount Everest, on the border of Nepal and China, is the highest mountain above sea level.",
     "What is the highest mountain above sea level?", ["Mount Everest", "Everest", "Chomolungma"]),
    ("K2", "K2, on the border of Pakistan and China, is the second highest mountain in the world.", None, None),
    ("Mont Blanc", "Mont Blanc is the highest mountain of the Alps, on the border of France and Italy.",
     "What is the highest mountain of the Alps?", ["Mont Blanc", "Monte Bianco"]),
    ("Kilimanjaro", "Kilimanjaro in Tanzania is the highest mountain in Africa.", None, None),
    ("Mississippi", "The Mississippi river flows south through the United States into the Gulf of Mexico.",
     None, None),
    ("Yangtze", "The Yangtze is the longest river in Asia and flows through China to Shanghai.",
     "What is the longest river in Asia?", ["Yangtze", "Yangtze River", "Chang Jiang"]),
    ("Lake Baikal", "Lake Baikal in Siberia is the deepest lake in the world.",
     "What is the deepest lake in the world?", ["Lake Baikal", "Baikal"]),
    ("Sahara", "The Sahara in North Africa is the largest hot desert in the world.", None, None),
    ("Victoria Falls", "Victoria Falls lies on the Zambezi river between Zambia and Zimbabwe.",
     "On which river does Victoria Falls lie?", ["Zambezi", "Zambezi River"]),
]


def passages() -> list[dict]:
    """All 200 passages, in a fixed order."""
    out = []
    for country, capital, continent, currency, language, fact in COUNTRIES:
        out.append((country, f"{country} is a country in {continent}. Its capital is {capital}. The currency of "
                             f"{country} is the {currency} and the main language is {language}."))
        out.append((capital, f"{capital} is the capital and a major city of {country}. The city {fact}."))
    for name, symbol, number, desc in ELEMENTS:
        out.append((name, f"{name} is a chemical element with the symbol {symbol} and atomic number {number}. "
                          f"It is {desc}."))
    for name, order, fact in PLANETS:
        out.append((f"{name} (planet)", f"{name} is planet number {order} from the Sun in the Solar System. "
                                        f"It is {fact}."))
    for book, author, year, _ in BOOKS:
        when = f"around {-year} BC" if year < 0 else f"in {year}"
        out.append((book, f"{book} is a work by {author}, first published {when}."))
    for painting, painter, museum, _ in PAINTINGS:
        out.append((painting, f"{painting} is a famous painting by {painter}. It can be seen in {museum}."))
    for invention, inventor, year, _ in INVENTIONS:
        out.append((f"Invention of the {invention}", f"The {invention} was invented by {inventor} in {year}."))
    for name, text, _, _ in GEOGRAPHY:
        out.append((name, text))
    return [{"id": f"p{i:03d}", "title": t, "text": x} for i, (t, x) in enumerate(out)]


def questions(rng: random.Random) -> list[dict]:
    """50 questions: 14 capitals, 8 elements, 3 planets, 8 books, 5 paintings, 5 inventions, 7 geography."""
    qs = []
    for country, capital, *_ in rng.sample(COUNTRIES, 14):
        qs.append((f"What is the capital of {country}?", [capital]))
    for name, symbol, *_ in rng.sample(ELEMENTS, 8):
        qs.append((f"Which chemical element has the symbol {symbol}?", [name]))
    for name, order, _ in rng.sample(PLANETS, 3):
        qs.append((f"Which planet is number {order} from the Sun?", [name]))
    unique_books = [b for b in BOOKS if b[1] not in ("Leo Tolstoy", "Charlotte Bronte", "Emily Bronte")]
    for book, author, _, aliases in rng.sample(unique_books, 8):
        qs.append((f"Who wrote {book}?", [author, *aliases]))
    for painting, painter, _, aliases in rng.sample(PAINTINGS, 5):
        qs.append((f"Who painted {painting}?", [painter, *aliases]))
    for invention, inventor, _, aliases in rng.sample(INVENTIONS, 5):
        qs.append((f"Who invented the {invention}?", [inventor, *aliases]))
    qs += [(q, a) for _, _, q, a in GEOGRAPHY if q is not None]
    return [{"id": f"q{i:03d}", "question": q, "answers": a} for i, (q, a) in enumerate(qs)]


def main() -> None:
    default_out = Path(__file__).resolve().parents[1] / "ragen" / "data" / "search_qa"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    corpus, qa = passages(), questions(random.Random(0))
    for name, rows in (("corpus.jsonl", corpus), ("qa.jsonl", qa)):
        lines = [json.dumps(r, ensure_ascii=False) for r in rows]
        (args.out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(corpus)} passages and {len(qa)} questions to {args.out}")


if __name__ == "__main__":
    main()
