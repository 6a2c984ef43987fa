"""The Flask test app: Flask-SQLAlchemy's ``db.session`` writes a user and enqueues its
welcome job in the request's transaction; ``fail`` aborts after both are written.

``flask --app tests.frameworks.flask_app sqlqueue …`` runs the sqlqueue commands on it, with
its database in ``FLASK_TEST_DATABASE_URL``.
"""

from __future__ import annotations

import os

import flask
from flask_sqlalchemy import SQLAlchemy

import sqlqueue
import sqlqueue.flask
from tests.frameworks.welcome import register_tasks, users


def create_app(database_url: str | None = None) -> flask.Flask:
    """The app on ``database_url`` (by default ``FLASK_TEST_DATABASE_URL``)."""
    app = flask.Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = database_url or os.environ["FLASK_TEST_DATABASE_URL"]
    db = SQLAlchemy(app)
    with app.app_context():
        queue = sqlqueue.Queue(db.engine)
    welcome = register_tasks(queue)
    sqlqueue.flask.init_app(app, queue)

    @app.post("/signups")
    def sign_up() -> tuple[dict[str, int], int]:
        result = db.session.execute(users.insert().values(email=flask.request.form["email"]))
        user_id = int(result.inserted_primary_key[0])  # type: ignore[attr-defined]
        job_id = welcome.enqueue(db.session, user_id=user_id)
        if flask.request.form.get("fail"):
            flask.abort(409)  # the session is removed, its transaction rolled back
        db.session.commit()
        return {"user": user_id, "job": job_id}, 201

    return app
