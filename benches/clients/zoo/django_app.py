"""Django ORM on psycopg 3 with Django's connection pool (psycopg_pool, five connections), for
the app zoo.

usage: django_app.py URL

`migrate` creates the schema (contenttypes, auth and this app's models, keyed by identity
columns) through the URL. Each step of the flow runs in `transaction.atomic()` and then closes
the connection, as the end of a request does, which returns it to the pool.
"""

import sys
from urllib.parse import unquote, urlsplit

import django
from django.conf import settings

from zoo_protocol import serve

url = urlsplit(sys.argv[1])
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_zoo"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": url.hostname,
            "PORT": url.port,
            "NAME": unquote(url.path[1:]),
            "USER": unquote(url.username),
            "PASSWORD": unquote(url.password),
            "OPTIONS": {"sslmode": "disable", "pool": {"min_size": 5}},
        }
    },
)
django.setup()

from django.core.management import call_command  # noqa: E402 (needs django.setup())
from django.db import connection, transaction  # noqa: E402
from django.db.models import Sum  # noqa: E402

from django_zoo.models import Author, Book  # noqa: E402

call_command("migrate", verbosity=0)
connection.close()
connection.pool.wait(timeout=60)


def step(flow):
    """One request: the flow in a transaction, then the connection back to the pool."""

    def run():
        try:
            with transaction.atomic():
                return flow()
        finally:
            connection.close()

    return run


def rows():
    books = Book.objects.select_related("author").order_by("id")
    return [f"row {b.id} {b.author.name} {b.title} {b.copies}" for b in books]


def create():
    ada = Author.objects.create(name="Ada")
    brian = Author.objects.create(name="Brian")
    books = [
        Book.objects.create(author=ada, title="Notes", copies=3),
        Book.objects.create(author=ada, title="Engines", copies=1),
        Book.objects.create(author=brian, title="C", copies=2),
    ]
    return [f"author {a.id} {a.name}" for a in (ada, brian)] + [
        f"book {b.id} {b.author_id} {b.title} {b.copies}" for b in books
    ]


def update():
    books = list(Book.objects.filter(author__name="Ada").order_by("id"))
    for b in books:
        b.copies += 1
        b.save()
    return [f"updated {len(books)}"] + [f"book {b.id} {b.copies}" for b in books]


def create_more():
    grace = Author.objects.create(name="Grace")
    book = Book.objects.create(author=grace, title="Compilers", copies=5)
    return [f"author {grace.id} {grace.name}", f"book {book.id} {book.author_id} {book.title} {book.copies}"]


def delete():
    book = Book.objects.get(title="Engines")
    book_id = book.id
    book.delete()
    return [f"deleted {book_id}"]


def summary():
    copies = Book.objects.aggregate(n=Sum("copies", default=0))["n"]
    head = f"authors {Author.objects.count()} books {Book.objects.count()} copies {copies}"
    return [head] + rows()


serve(
    connection.pool.get_stats()["pool_size"],
    [step(f) for f in (create, rows, update, create_more, delete, summary)],
    connection.close_pool,
)
