"""batch_sealed: a batch whose creator still uploads shots does not end (POST /v1/batches/{id}/seal)

Revision ID: 0009_batch_sealed
Revises: 0008_service_facts
"""
import sqlalchemy as sa
from alembic import op

revision = '0009_batch_sealed'
down_revision = '0008_service_facts'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('batches') as batch:
        batch.add_column(sa.Column('sealed', sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table('batches') as batch:
        batch.drop_column('sealed')
