"""A Flask app with Flask-SQLAlchemy: a signup and its welcome job commit together through
``db.session``, and ``flask sqlqueue …`` operates the queue.

Run the demo (an SQLite file in a temporary directory; two signups through Flask's test client,
one rolled back, then ``flask sqlqueue worker --burst`` runs what committed)::

    python examples/flask_app.py

Use the commands yourself (``DATABASE_URL`` names the database)::

    DATABASE_URL=sqlite:///shop.db flask --app examples/flask_app.py sqlqueue migrate
    DATABASE_URL=sqlite:///shop.db flask --app examples/flask_app.py sqlqueue worker
    DATABASE_URL=sqlite:///shop.db flask --app examples/flask_app.py sqlqueue stats
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import flask
import sqlalchemy as sa
from flask_sqlalchemy import SQLAlchemy

import sqlqueue
import sqlqueue.flask

app = flask.Flask(__name__)
app.config["SQLALCHEMY_DATABASE_URI"] = os.environ.setdefault(
    "DATABASE_URL", f"sqlite:///{tempfile.mkdtemp(prefix='sqlqueue-flask-')}/shop.db"
)
db = SQLAlchemy(app)
users = sa.Table(
    "example_users",
    db.metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("email", sa.String(200), nullable=False),
    sa.Column("welcomed", sa.Boolean, nullable=False, default=False),
)
with app.app_context():
    queue = sqlqueue.Queue(db.engine)
sqlqueue.flask.init_app(app, queue)


@queue.task("welcome")
def welcome(user_id: int) -> None:
    """Send the welcome (here: mark the user welcomed). Handlers run on worker threads: the
    app context that db.session needs is pushed here."""
    with app.app_context():
        db.session.execute(users.update().where(users.c.id == user_id).values(welcomed=True))
        db.session.commit()


@app.post("/signups")
def sign_up() -> tuple[dict[str, int], int]:
    """The user and the welcome job commit together, or neither does."""
    result = db.session.execute(users.insert().values(email=flask.request.form["email"]))
    user_id = int(result.inserted_primary_key[0])  # type: ignore[attr-defined]
    job_id = welcome.enqueue(db.session, user_id=user_id)
    if flask.request.form.get("fail"):
        flask.abort(409)  # the request's session is removed: its transaction rolls back
    db.session.commit()
    return {"user": user_id, "job": job_id}, 201


def main() -> None:
    flask_command = [sys.executable, "-m", "flask", "--app", __file__, "sqlqueue"]
    subprocess.run([*flask_command, "migrate"], check=True)
    with app.app_context():
        db.create_all()
    client = app.test_client()
    kept = client.post("/signups", data={"email": "ada@example.com"}).get_json()
    refused = client.post("/signups", data={"email": "bob@example.com", "fail": "1"})
    print(f"signed up user {kept['user']}, job {kept['job']}")
    print(f"refused signup: HTTP {refused.status_code}, nothing of it kept")
    subprocess.run([*flask_command, "worker", "--burst"], check=True)
    with app.app_context():
        rows = db.session.execute(sa.select(users.c.email, users.c.welcomed)).all()
    print(f"users: {[tuple(row) for row in rows]}; jobs: {queue.stats().by_status}")


if __name__ == "__main__":
    main()
