"""SQLAlchemy 2 ORM on psycopg 3, its default QueuePool (five connections), for the app zoo.

usage: sqlalchemy_orm.py URL

The schema comes from the models (`metadata.create_all`): `author` keyed by a serial column,
`book` by an identity column. Each step of the flow is one ORM session inside a transaction.
"""

import sys
import threading

from sqlalchemy import ForeignKey, Identity, create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from zoo_protocol import serve


class Base(DeclarativeBase):
    pass


class Author(Base):
    __tablename__ = "author"
    # An Integer primary key without Identity() becomes SERIAL on PostgreSQL.
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    books: Mapped[list["Book"]] = relationship(back_populates="author", order_by="Book.id")


class Book(Base):
    __tablename__ = "book"
    id: Mapped[int] = mapped_column(Identity(), primary_key=True)
    author_id: Mapped[int] = mapped_column(ForeignKey("author.id"))
    title: Mapped[str]
    copies: Mapped[int]
    author: Mapped[Author] = relationship(back_populates="books")


engine = create_engine(sys.argv[1].replace("postgres://", "postgresql+psycopg://", 1))
Base.metadata.create_all(engine)
# Open the whole pool: its connections checked out at once (from threads, as a web server's
# workers would), then returned.
size = engine.pool.size()
held = []
lock = threading.Lock()


def check_out():
    c = engine.connect()
    with lock:
        held.append(c)


workers = [threading.Thread(target=check_out) for _ in range(size)]
for w in workers:
    w.start()
for w in workers:
    w.join()
for c in held:
    c.close()


def rows(s):
    query = select(Book).join(Book.author).order_by(Book.id)
    return [f"row {b.id} {b.author.name} {b.title} {b.copies}" for b in s.scalars(query)]


def create():
    with Session(engine) as s, s.begin():
        ada, brian = Author(name="Ada"), Author(name="Brian")
        books = [
            Book(author=ada, title="Notes", copies=3),
            Book(author=ada, title="Engines", copies=1),
            Book(author=brian, title="C", copies=2),
        ]
        s.add_all([ada, brian, *books])
        s.flush()
        return [f"author {a.id} {a.name}" for a in (ada, brian)] + [
            f"book {b.id} {b.author_id} {b.title} {b.copies}" for b in books
        ]


def read():
    with Session(engine) as s, s.begin():
        return rows(s)


def update():
    with Session(engine) as s, s.begin():
        ada = s.scalars(select(Author).where(Author.name == "Ada")).one()
        for b in ada.books:
            b.copies += 1
        s.flush()
        return [f"updated {len(ada.books)}"] + [f"book {b.id} {b.copies}" for b in ada.books]


def create_more():
    with Session(engine) as s, s.begin():
        grace = Author(name="Grace")
        book = Book(author=grace, title="Compilers", copies=5)
        s.add_all([grace, book])
        s.flush()
        return [f"author {grace.id} {grace.name}", f"book {book.id} {book.author_id} {book.title} {book.copies}"]


def delete():
    with Session(engine) as s, s.begin():
        book = s.scalars(select(Book).where(Book.title == "Engines")).one()
        s.delete(book)
        return [f"deleted {book.id}"]


def summary():
    with Session(engine) as s, s.begin():
        authors = s.scalar(select(func.count()).select_from(Author))
        books = s.scalar(select(func.count()).select_from(Book))
        copies = s.scalar(select(func.coalesce(func.sum(Book.copies), 0)))
        return [f"authors {authors} books {books} copies {copies}"] + rows(s)


serve(size, [create, read, update, create_more, delete, summary], engine.dispose)
