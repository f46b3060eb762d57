"""The coordinator's database: the engine and its UTC time column (`engine`), the SQLModel
tables (`models`) and their SQLAlchemy Core tables (`tables`), the Alembic migrations
(`migrations/`), database faults as answers (`faults`) and housekeeping (`maintenance`)."""
