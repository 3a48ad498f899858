"""service_facts: what the service records about itself (the storage its files are in)

Revision ID: 0008_service_facts
Revises: 0007_hardening
"""
import sqlalchemy as sa
from alembic import op

revision = '0008_service_facts'
down_revision = '0007_hardening'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'service_facts',
        sa.Column('key', sa.String(length=64), nullable=False),
        sa.Column('value', sa.String(length=500), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('key'),
    )


def downgrade() -> None:
    op.drop_table('service_facts')
